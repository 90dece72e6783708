package outboxd

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Issue 26 item 12: SIGTERM while a topic is held, with nothing else in
// flight, stops within a second or so of the last ack, not after the whole
// --shutdown-timeout; nothing past the held event is confirmed.
func TestShutdownDoesNotWaitForHeldTopics(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) { c.ShutdownTimeout = 30 * time.Second })
	h.relay.state.setTopicHold("outbox.event.Order", errors.New(`kafka topic "outbox.event.Order" is missing`))
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1) // handed to the sink, which holds it: never acked
	start := time.Now()
	h.cancel()
	h.loopErr(10 * time.Second)
	h.s.finish(canceled, true)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("shutdown took %s with only a held topic's event in flight", took)
	}
	h.neverSentAbove(100)
}

// Without a held topic the shutdown waits for the acks as before, up to
// --shutdown-timeout.
func TestShutdownWaitsForAcksWithoutHolds(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) { c.ShutdownTimeout = 1500 * time.Millisecond })
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1)
	start := time.Now()
	h.cancel()
	h.loopErr(10 * time.Second)
	h.s.finish(canceled, true)
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("shutdown returned after %s, before --shutdown-timeout, with an event in flight and no hold", took)
	}
	h.neverSentAbove(100)
}

var canceled = func() context.Context { ctx, cancel := context.WithCancel(context.Background()); cancel(); return ctx }()
