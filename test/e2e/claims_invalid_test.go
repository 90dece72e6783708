package e2e

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"
)

// At-least-once with --on-invalid dead-letter: an event the broker refuses
// (the topic's max.message.bytes) is dead-lettered when the session replays
// it, and the event that only shared its batch is sent: the topic holds
// events 1 and 3 once each, in order, the dead-letter topic event 2 once.
func TestBrokerRejectionDeadLetteredInOrder(t *testing.T) {
	f := newFixture(t)
	if _, err := f.admin().CreateTopic(f.ctx, 1, 1, map[string]*string{"max.message.bytes": ptr("1000")}, f.topic()); err != nil {
		t.Fatal(err)
	}
	dlq := "dlq." + f.agg
	r := f.startRelay("--on-invalid", "dead-letter", "--dead-letter-topic", dlq)
	big := `{"pad": "` + strings.Repeat("x", 3000) + `"}`
	end := f.commit(event{1, "a", "E", `{}`}, event{2, "a", "E", big}, event{3, "a", "E", `{}`})
	f.waitConfirmed(end, 60*time.Second)
	var ids []string
	for _, rec := range f.records() {
		id, _ := header(rec, "id")
		ids = append(ids, id)
	}
	if got, want := strings.Join(ids, ","), eventID(1)+","+eventID(3); got != want {
		t.Fatalf("topic holds %s, want %s", got, want)
	}
	dl := f.readTopic(dlq, 1)
	if n := f.topicCount(dlq); n != 1 {
		t.Fatalf("dead-letter topic holds %d records, want 1", n)
	}
	h := headerMap(dl[0])
	if h["id"] != eventID(2) || h["outboxd.source"] != "public.outbox" || h["outboxd.commit_lsn"] == "" || h["outboxd.xid"] == "" || h["outboxd.error"] == "" {
		t.Fatalf("dead letter headers %v", h)
	}
	if v := r.metric(t, "outboxd_events_dead_lettered_total"); v != 1 {
		t.Fatalf("outboxd_events_dead_lettered_total %v, want 1", v)
	}
	r.stop(t, f.ctx)
}

// --max-message-bytes: a record above it is caught before anything is sent
// (dead-lettered here, naming the option); one below it is delivered.
func TestMaxMessageBytes(t *testing.T) {
	f := newFixture(t)
	dlq := "dlq." + f.agg
	r := f.startRelay("--max-message-bytes", "2000", "--on-invalid", "dead-letter", "--dead-letter-topic", dlq)
	fits := `{"pad": "` + strings.Repeat("s", 1000) + `"}`
	over := `{"pad": "` + strings.Repeat("x", 2500) + `"}`
	end := f.commit(event{1, "a", "E", fits}, event{2, "a", "E", over}, event{3, "a", "E", `{}`})
	f.waitConfirmed(end, 30*time.Second)
	recs := f.records()
	if len(recs) != 2 || string(recs[0].Value) != fits || string(recs[1].Value) != `{}` {
		t.Fatalf("topic holds %d records, want events 1 (%d bytes) and 3", len(recs), len(fits))
	}
	dl := f.readTopic(dlq, 1)
	h := headerMap(dl[0])
	if h["id"] != eventID(2) || !strings.Contains(h["outboxd.error"], "more than --max-message-bytes allows") {
		t.Fatalf("dead letter headers %v", h)
	}
	// It keeps what fits: the other columns, the payload as its length and
	// sha256, and a header saying so.
	sum := sha256.Sum256([]byte(over))
	if v := string(dl[0].Value); !strings.Contains(v, `"aggregateid":"a"`) ||
		!strings.Contains(v, fmt.Sprintf(`"payload":{"outboxd_omitted_bytes":%d,"sha256":"%x"}`, len(over), sum)) ||
		!strings.HasPrefix(h["outboxd.value_omitted"], "columns payload replaced by their length and sha256") {
		t.Fatalf("dead letter value %s, outboxd.value_omitted %q", v, h["outboxd.value_omitted"])
	}
	if v := r.metric(t, "outboxd_kafka_produce_errors_total"); v != 0 {
		t.Fatalf("outboxd_kafka_produce_errors_total %v: the record was sent to the broker", v)
	}
	r.stop(t, f.ctx)
}
