package outboxd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/router"
)

// stubEncoder stands for the schema stage (package schema): it prefixes
// values, refuses event bad as an invalid payload, and fails with down
// while the registry is "down".
type stubEncoder struct {
	bad  string
	down error
}

func (e *stubEncoder) Encode(_ context.Context, source string, rec *router.Record) error {
	id := eventID(rec.Headers)
	switch {
	case e.down != nil:
		return e.down
	case id == e.bad:
		return &router.InvalidError{Table: source, EventID: id, Reason: "the payload does not match its schema: field n: want a string"}
	}
	rec.Value = append([]byte("enc:"), rec.Value...)
	return nil
}

// A payload the encoder refuses is held before, like a row the router
// cannot route: the event before it is produced encoded, nothing of it or
// after it, and the hold names the table, the id and the field.
func TestEncoderInvalidPayloadHolds(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) { c.Encoder = &stubEncoder{bad: uuid(2)} })
	h.start()
	h.stream.push(txn(200, 210, uuid(1), uuid(2), uuid(3))...)
	var hold *holdError
	if err := h.loopErr(5 * time.Second); !errors.As(err, &hold) || hold.rec != nil || hold.table != "public.outbox" || hold.id != uuid(2) || hold.pos.n != 1 {
		t.Fatalf("session error %v, want a hold at event 2", err)
	}
	if !errors.Is(hold, router.ErrInvalid) || !containsAll(hold.Error(), "field n") {
		t.Fatalf("hold %q does not name the field", hold)
	}
	if n := h.sink.count(); n != 1 || string(h.sink.records[0].Value) != `enc:{"n":1}` {
		t.Fatalf("%d records produced (first %q), want 1 encoded", n, h.sink.records[0].Value)
	}
	h.neverSentAbove(100)
}

// In dead-letter mode the refused payload goes to the dead-letter topic
// unencoded, in its place, with the reason; the others are encoded.
func TestEncoderInvalidPayloadDeadLetters(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) {
		c.Encoder = &stubEncoder{bad: uuid(2)}
		c.OnInvalid = OnInvalidDeadLetter
	})
	h.start()
	h.stream.push(txn(200, 210, uuid(1), uuid(2), uuid(3))...)
	h.sink.waitProduced(t, 3)
	r := h.sink.records
	if r[0].Topic != "outbox.event.Order" || r[1].Topic != "dlq" || r[2].Topic != "outbox.event.Order" ||
		string(r[0].Value) != `enc:{"n":1}` || string(r[2].Value) != `enc:{"n":1}` {
		t.Fatalf("records %q %q %q", r[0].Value, r[1].Value, r[2].Value)
	}
	var reason string
	for _, hd := range r[1].Headers {
		if hd.Key == router.HeaderError {
			reason = string(hd.Value)
		}
	}
	if !containsAll(reason, "field n", uuid(2)) {
		t.Fatalf("dead letter's %s header %q does not name the field and event", router.HeaderError, reason)
	}
	for i := range 3 {
		h.sink.ack(i, nil)
	}
	h.waitSent(210)
}

// A registry that is down ends the session with its error (the relay then
// reconnects with backoff, as after a broker outage): not a hold, nothing
// produced from the event on, nothing confirmed past the acked event before.
func TestEncoderUnavailableEndsTheSession(t *testing.T) {
	down := errors.New("schema registry: connection refused")
	enc := &stubEncoder{}
	h := newHarness(t, 100, func(c *Config) { c.Encoder = enc })
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1)
	h.sink.ack(0, nil)
	h.waitSent(210)
	enc.down = down // the loop reads it only on the next event, pushed after
	h.stream.push(txn(300, 310, uuid(2), uuid(3))...)
	var hold *holdError
	if err := h.loopErr(5 * time.Second); !errors.Is(err, down) || errors.As(err, &hold) {
		t.Fatalf("session error %v, want the registry's error", err)
	}
	if n := h.sink.count(); n != 1 {
		t.Fatalf("%d records produced, want 1", n)
	}
	h.neverSentAbove(210)
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
