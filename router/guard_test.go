package router

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

// Routing values and headers come from whoever may write the outbox: none of
// them may reach outboxd's own topics or shadow its headers.
func TestReservedAndAllowedTopics(t *testing.T) {
	cfg := Config{
		Defaults:              Options{"route.topic.replacement": "${routedByValue}"},
		ReservedTopics:        []string{"outboxd.checkpoints", "outboxd.deadletter"},
		ReservedTopicPrefixes: []string{"outboxd.", "__"},
		MessagePrefix:         "outbox",
	}
	r := mustNew(t, cfg)
	for _, topic := range []string{"outboxd.checkpoints", "outboxd.deadletter", "outboxd.other", "__consumer_offsets"} {
		_, err := r.Route(row(debeziumRel(), uuid1, topic, "k", "T", `{}`), testTx)
		checkInvalid(t, err, "public.outbox", uuid1, `"`+topic+`"`)
		_, _, err = r.RouteMessage(msg("outbox", `{"id": "m1", "aggregatetype": "`+topic+`"}`), testTx)
		checkInvalid(t, err, "message:outbox", "m1", `"`+topic+`"`)
	}
	if _, err := r.Route(row(debeziumRel(), uuid1, "orders", "k", "T", `{}`), testTx); err != nil {
		t.Fatal(err)
	}
	// Exact names stay reserved even without the prefix rule.
	cfg.ReservedTopicPrefixes = nil
	cfg.ReservedTopics = []string{"cp"}
	_, err := mustNew(t, cfg).Route(row(debeziumRel(), uuid1, "cp", "k", "T", `{}`), testTx)
	checkInvalid(t, err, "public.outbox", uuid1, "outboxd's own")

	cfg.TopicAllow = []string{"orders.", "billing."}
	r = mustNew(t, cfg)
	if _, err := r.Route(row(debeziumRel(), uuid1, "billing.Invoice", "k", "T", `{}`), testTx); err != nil {
		t.Fatal(err)
	}
	_, err = r.Route(row(debeziumRel(), uuid1, "Surprise", "k", "T", `{}`), testTx)
	checkInvalid(t, err, "public.outbox", uuid1, "--topic-allow orders.,billing.")
}

func TestReservedHeaderNames(t *testing.T) {
	withHdr := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB, "headers", tJSONB)
	r := mustNew(t, Config{MessagePrefix: "outbox", Defaults: Options{"table.fields.additional.placement": "type:header:eventType"}})
	for _, hdrs := range []string{`{"id": "forged"}`, `{"a": "b", "eventType": "x"}`, `{"outboxd.commit_lsn": "FFFFFFFF/FFFFFFFF"}`, `{"\u0069d": "escaped"}`} {
		_, err := r.Route(row(withHdr, uuid1, "Order", "k", "T", `{}`, hdrs), testTx)
		checkInvalid(t, err, "public.outbox", uuid1, "reserved")
		_, _, err = r.RouteMessage(msg("outbox", `{"id": "m1", "aggregatetype": "A", "headers": `+hdrs+`}`), testTx)
		checkInvalid(t, err, "message:outbox", "m1", "reserved")
	}
	// "type" is only reserved while a placement puts a header by that name.
	got, err := r.Route(row(withHdr, uuid1, "Order", "k", "T", `{}`, `{"type": "t", "ID": "x"}`), testTx)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, got, Record{Topic: "outbox.event.Order", Key: b("k"), Value: b(`{}`), Headers: h("id", uuid1, "eventType", "T", "type", "t", "ID", "x"), Timestamp: commitTime, Partition: -1})
}

func TestHeaderCountAndSizeChecksBeforeBuilding(t *testing.T) {
	withHdr := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tJSONB, "headers", tJSONB)
	var many strings.Builder
	many.WriteString("{")
	for i := 0; i < 65; i++ {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`"h` + strings.Repeat("x", i) + `": ""`)
	}
	many.WriteString("}")
	r := mustNew(t, Config{MaxRecordBytes: 1000, MessagePrefix: "outbox"})
	_, err := r.Route(row(withHdr, uuid1, "Order", "k", `{}`, many.String()), testTx)
	checkInvalid(t, err, "public.outbox", uuid1, "more than 64 headers")

	big := `{"v": "` + strings.Repeat("x", 1000) + `"}`
	_, err = r.Route(row(withHdr, uuid1, "Order", "k", big, nil), testTx)
	checkInvalid(t, err, "public.outbox", uuid1, "more than --max-message-bytes")
	_, _, err = r.RouteMessage(msg("outbox", `{"id": "m1", "aggregatetype": "A", "payload": `+big+`}`), testTx)
	checkInvalid(t, err, "message:outbox", "m1", "more than --max-message-bytes")
	// Header overhead counts: 10 one-byte headers fit 1000 bytes of data
	// but not of Size.
	tiny := `{"a":"","b":"","c":"","d":"","e":"","f":"","g":"","h":"","i":"","j":"","k":"","l":""}`
	_, err = r.Route(row(withHdr, uuid1, "Order", "k", `{}`, tiny), testTx)
	checkInvalid(t, err, "public.outbox", uuid1, "more than --max-message-bytes")
	got, err := r.Route(row(withHdr, uuid1, "Order", "k", `{}`, `{"a": ""}`), testTx)
	if err != nil || got.Size() > 1000 {
		t.Fatal(got.Size(), err)
	}

	// A row the stream cut short is invalid whatever it holds, and its dead
	// letter carries no value.
	cut := row(withHdr, uuid1, "Order", "k", `{}`, nil)
	cut.Values = cut.Values[:1] // only the id fitted
	cut.Oversize = 150 << 20
	_, err = r.Route(cut, testTx)
	checkInvalid(t, err, "public.outbox", uuid1, "157286400 bytes as PostgreSQL sent it")
	dl := r.DeadLetter("outboxd.deadletter", cut, testTx, err)
	if dl.Value != nil || headerValue(dl, HeaderValueOmitted) == "" || headerValue(dl, "id") != uuid1 {
		t.Fatalf("dead letter %s", showRecord(dl))
	}
	if got := headerValue(dl, HeaderValueOmitted); !strings.Contains(got, "the whole value") || !strings.Contains(got, "157286400 bytes") {
		t.Fatalf("%s header %q does not say what is omitted and why", HeaderValueOmitted, got)
	}
	// A whole row too large for a dead letter keeps what fits: every
	// column but the largest, which is replaced by its length and sha256,
	// and the header says which column that was.
	r4 := mustNew(t, Config{MaxRecordBytes: 4000})
	big4 := `{"v": "` + strings.Repeat("x", 5000) + `"}`
	full := row(withHdr, uuid1, "Order", "k", big4, nil)
	_, err = r4.Route(full, testTx)
	dl = r4.DeadLetter("outboxd.deadletter", full, testTx, err)
	sum := sha256.Sum256([]byte(big4))
	want := `{"id":"` + uuid1 + `","aggregatetype":"Order","aggregateid":"k","payload":{"outboxd_omitted_bytes":5009,"sha256":"` + hex.EncodeToString(sum[:]) + `"},"headers":null}`
	if string(dl.Value) != want || dl.Size() > 4000 || !strings.Contains(headerValue(dl, HeaderError), "more than --max-message-bytes") {
		t.Fatalf("dead letter %s\nwant value %s", showRecord(dl), want)
	}
	if got := headerValue(dl, HeaderValueOmitted); got != "columns payload replaced by their length and sha256: the row's columns take 5129 bytes as JSON, over --max-message-bytes" {
		t.Fatalf("%s header %q", HeaderValueOmitted, got)
	}
	// Where even that does not fit (the headers alone take most of 1000
	// bytes), the value is left out and the header says so.
	full = row(withHdr, uuid1, "Order", "k", big, nil)
	_, err = r.Route(full, testTx)
	dl = r.DeadLetter("outboxd.deadletter", full, testTx, err)
	if dl.Value != nil || dl.Size() > 1000 || !strings.HasPrefix(headerValue(dl, HeaderValueOmitted), "the whole value: the row's columns take 1129 bytes as JSON") {
		t.Fatalf("dead letter %s", showRecord(dl))
	}
}

// Error() reaches /status and /readyz: it must not carry the row's values,
// which only the log (LogValue) and the dead letter see.
func TestInvalidErrorKeepsValuesOut(t *testing.T) {
	r := mustNew(t, Config{})
	secret := "Order with a secret: 4111-1111-1111-1111"
	_, err := r.Route(row(debeziumRel(), uuid1, secret, "k", "T", `{}`), testTx)
	var inv *InvalidError
	if !errors.As(err, &inv) {
		t.Fatal(err)
	}
	if strings.Contains(err.Error(), "4111") || !strings.Contains(inv.LogValue().String(), "4111") || !strings.Contains(err.Error(), uuid1) {
		t.Fatalf("Error() %q, LogValue %q", err.Error(), inv.LogValue().String())
	}
	long := strings.Repeat("y", 1000)
	_, err = r.Route(row(debeziumRel(), long, "bad topic", "k", "T", `{}`), testTx)
	if len(err.Error()) > 600 || len(inv.LogValue().String()) > 600 {
		t.Fatalf("error of %d bytes", len(err.Error()))
	}
}

func headerValue(r Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// The size checked before building is never below the record's Size: an
// event that passes it is never one the caller's exact check refuses.
func TestSizeEstimateCoversSize(t *testing.T) {
	withHdr := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB, "headers", tJSONB)
	rows := []*wal.Row{
		row(withHdr, uuid1, "Order", "o-1", "OrderCreated", `{"total": "59.90"}`, `{"traceparent": "00-4bf9", "k\u00e9": "v"}`),
		row(withHdr, uuid1, "Order", "o-\x01\"", "T", `{"a": "\u2028"}`, nil),
	}
	for _, cfg := range []Config{
		{},
		{LSNHeaders: true, KeyFormat: "json-string", Defaults: Options{"table.fields.additional.placement": "type:header,aggregateid:envelope"}},
	} {
		for _, rw := range rows {
			rec, err := mustNew(t, cfg).Route(rw, testTx)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxRecordBytes = rec.Size() - 1
			if _, err := mustNew(t, cfg).Route(rw, testTx); !errors.Is(err, ErrInvalid) {
				t.Errorf("Size %d passed a check of %d", rec.Size(), cfg.MaxRecordBytes)
			}
			cfg.MaxRecordBytes = 0
		}
	}
	for _, cfg := range []Config{{MessagePrefix: "outbox"}, {MessagePrefix: "outbox", LSNHeaders: true, KeyFormat: "json-string"}} {
		m := msg("outbox", `{"id": "e1", "aggregatetype": "Order", "aggregateid": "o-1", "type": "OrderCreated", "payload": {"total": "59.90"}, "headers": {"a": "b"}}`)
		rec, _, err := mustNew(t, cfg).RouteMessage(m, testTx)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxRecordBytes = rec.Size() - 1
		if _, _, err := mustNew(t, cfg).RouteMessage(m, testTx); !errors.Is(err, ErrInvalid) {
			t.Errorf("message Size %d passed a check of %d", rec.Size(), cfg.MaxRecordBytes)
		}
	}
}
