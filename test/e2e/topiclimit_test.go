package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink/kafka"
)

// Issue 31, item 2: ten events of one aggregate, each about 380 bytes as a
// batch of its own, on a topic whose max.message.bytes is 1000. Each fits;
// together they do not. outboxd must size its batches by the topic's limit:
// the broker refuses nothing, so nothing is dead-lettered, held, re-sent or
// reordered. Before, franz-go packed them into one batch up to its global
// 1,000,012 bytes, the broker refused the batch, and the refusal path
// dead-lettered valid events or wrote later events of the aggregate first.
func TestTopicLimitBatchesFit(t *testing.T) {
	for _, mode := range []string{"fail", "dead-letter", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t)
			if _, err := f.admin().CreateTopic(f.ctx, 1, 1, map[string]*string{"max.message.bytes": ptr("1000")}, f.topic()); err != nil {
				t.Fatal(err)
			}
			dlq := "dlq." + f.agg
			args := []string{"--on-invalid", "dead-letter", "--dead-letter-topic", dlq}
			switch mode {
			case "fail":
				args = []string{"--on-invalid", "fail"}
			case "exactly-once":
				args = []string{"--exactly-once", "--checkpoint-topic", "cp." + f.agg}
			}
			r := f.startRelay(args...)
			pad := `{"pad": "` + strings.Repeat("x", 250) + `"}`
			events := make([]event, 10)
			want := make([]string, 10)
			for i := range events {
				events[i] = event{i + 1, "a", "E", pad}
				want[i] = eventID(i + 1)
			}
			f.waitConfirmed(f.commit(events...), 60*time.Second)

			var recs []*kgo.Record
			if mode == "exactly-once" {
				recs = f.readCommitted(10)
			} else {
				recs = f.records()
			}
			first, dups := byID(t, recs)
			if len(recs) != 10 || len(first) != 10 || dups != 0 {
				t.Fatalf("the topic holds %d records (%d distinct, %d duplicates); want the 10 events once each\n%s", len(recs), len(first), dups, tailString(r.Log(), 4000))
			}
			if got := perKey(t, recs)["a"]; strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("order %v, want %v", got, want)
			}
			// The premise: each event fits the topic's limit alone, and
			// any three together do not.
			for _, rec := range recs {
				rr := &router.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value}
				for _, h := range rec.Headers {
					rr.Headers = append(rr.Headers, router.Header{Key: h.Key, Value: h.Value})
				}
				if n := kafka.BatchSize(rr); n > 1000 || 3*n < 1000 {
					t.Fatalf("an event's batch is %d bytes: the test needs each to fit 1000 bytes and three not to", n)
				}
			}
			if v := r.metric(t, "outboxd_kafka_produce_errors_total"); v != 0 {
				t.Fatalf("outboxd_kafka_produce_errors_total %v: the broker refused a batch of events that each fit\n%s", v, tailString(r.Log(), 4000))
			}
			if v := r.metric(t, "outboxd_events_dead_lettered_total"); v != 0 {
				t.Fatalf("outboxd_events_dead_lettered_total %v, want 0", v)
			}
			r.stop(t, f.ctx)
		})
	}
}
