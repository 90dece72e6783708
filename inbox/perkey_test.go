package inbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// keyed makes events "key:id" pairs, offsets in order.
func keyed(pairs ...string) []*Event {
	evs := make([]*Event, len(pairs))
	for i, kv := range pairs {
		k, id, _ := strings.Cut(kv, ":")
		evs[i] = &Event{ID: id, Key: []byte(k), Topic: "orders", Offset: int64(i)}
	}
	return evs
}

// A key whose event fails transiently waits for its retry with its later
// events queued behind it; the other keys are applied meanwhile. The offset
// never passes the retrying event before it is applied.
func TestRetryingKeyDoesNotBlockOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fails := 2
		h := newHarness(t, settings{maxAttempts: 5}, func(db *fakeDB, ev *Event) error {
			if ev.ID == "a1" && fails > 0 {
				fails--
				return errors.New("deadlock detected, try again")
			}
			return apply(db, ev)
		})
		h.run(t, keyed("k1:a1", "k2:b1", "k1:a2", "k2:b2"))
		_, effects := h.db.snapshot()
		if want := []string{"b1", "b2", "a1", "a2"}; !slices.Equal(effects, want) {
			t.Fatalf("effects %q, want %q: k2 goes on while k1 retries, k1 keeps its order", effects, want)
		}
		if !slices.Equal(h.marked(), []int64{1, 3}) {
			t.Fatalf("marks %v, want [1 3]: nothing marked before a1 is applied", h.marked())
		}
		if len(h.db.parked) != 0 {
			t.Fatalf("parked %v", h.db.parked)
		}
	})
}

// ParkKey: a Permanent error parks the event at once (one handler call) and
// the key's later events behind it, without running the handler for them;
// the other keys are applied. Park parks the event alone.
func TestPoisonParksItsAggregate(t *testing.T) {
	for _, mode := range []Poison{ParkKey, Park} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				calls := map[string]int{}
				h := newHarness(t, settings{maxAttempts: 5, onPoison: mode}, func(db *fakeDB, ev *Event) error {
					mu.Lock()
					calls[ev.ID]++
					mu.Unlock()
					if ev.ID == "a1" {
						return Permanent(errors.New("no such account"))
					}
					return apply(db, ev)
				})
				h.run(t, keyed("k1:a1", "k2:b1", "k1:a2", "k2:b2", "k1:a3"))
				_, effects := h.db.snapshot()
				want, parked := []string{"b1", "b2"}, []string{"a1", "a2", "a3"}
				if mode == Park {
					want, parked = []string{"b1", "a2", "b2", "a3"}, nil
				}
				if !slices.Equal(effects, want) {
					t.Fatalf("effects %q, want %q", effects, want)
				}
				if !slices.Equal(h.db.keys["k1"], parked) {
					t.Fatalf("k1's parked aggregate %q, want %q in order", h.db.keys["k1"], parked)
				}
				if calls["a1"] != 1 || calls["a2"] > 1 || (mode == ParkKey && calls["a2"] != 0) {
					t.Fatalf("handler calls %v: a Permanent error is not retried, a parked key's later events are not run", calls)
				}
				if !h.db.inbox["a2"] || !h.db.inbox["a3"] {
					t.Fatal("events parked behind have no inbox row: a replay would apply them")
				}
				if m := h.marked(); m[len(m)-1] != 4 {
					t.Fatalf("marks %v, want the end", m)
				}
			})
		})
	}
}

// An event that earlier processes started MaxAttempts times without
// finishing (they crashed on it) is parked without running the handler;
// after one crash the batch is applied one event at a time, and the counts
// of applied events are deleted.
func TestCrashLoopParksAfterMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, settings{maxAttempts: 3, batch: 10}, func(db *fakeDB, ev *Event) error {
			if ev.ID == "oom" {
				t.Error("the handler ran for an event that crashed 3 processes")
			}
			return apply(db, ev)
		})
		h.db.starts["oom"] = 3 // three processes died on it
		h.db.starts["a"] = 0   // in the same batch as it once
		h.run(t, keyed("k1:a", "k2:oom", "k3:b"))
		ops, effects := h.db.snapshot()
		if !slices.Equal(effects, []string{"a", "b"}) {
			t.Fatalf("effects %q", effects)
		}
		if !strings.Contains(h.db.parked["oom"], "ended 3 times") {
			t.Fatalf("parked %v", h.db.parked)
		}
		if n := strings.Count(strings.Join(ops, ","), "commit"); n != 3 {
			t.Fatalf("%d commits, want 3 (one at a time after a crash): %q", n, ops)
		}
		if len(h.db.starts) != 0 {
			t.Fatalf("attempt counts left %v, want none", h.db.starts)
		}
		// The next batch, with no crash behind it, is one transaction.
		h2 := newHarness(t, settings{maxAttempts: 3, batch: 10}, apply)
		h2.run(t, keyed("k1:x", "k2:y"))
		if ops, _ := h2.db.snapshot(); strings.Count(strings.Join(ops, ","), "commit") != 1 {
			t.Fatalf("ops %q, want one transaction", ops)
		}
	})
}

// Off, tracing costs the handler call nothing.
func TestTracingOffAllocatesNothing(t *testing.T) {
	ev := &Event{ID: "1", Topic: "orders", Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}}
	h := func(context.Context, pgxTx, *Event) error { return nil }
	var off *tracing
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _ = off.apply(ctx, h, nil, ev) }); n != 0 {
		t.Fatalf("%v allocations per event with tracing off, want 0", n)
	}
}

// On, the handler runs inside a CONSUMER span that is the child of the span
// the traceparent header names, and the handler's ctx carries it.
func TestSpanContinuesTraceparent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := trace.NewTracerProvider(trace.WithSpanProcessor(rec))
	tr := newTracing(tp, natsBroker, "billing")
	ev := &Event{ID: "ev-1", Topic: "outbox.event.Order", Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}}
	var inHandler oteltrace.SpanContext
	err := tr.apply(context.Background(), func(ctx context.Context, _ pgxTx, _ *Event) error {
		inHandler = oteltrace.SpanContextFromContext(ctx)
		return errors.New("boom")
	}, nil, ev)
	if err == nil {
		t.Fatal("the handler's error was lost")
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || s.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("span trace %s parent %s: not the traceparent's child", s.SpanContext().TraceID(), s.Parent().SpanID())
	}
	if s.SpanKind() != oteltrace.SpanKindConsumer || s.Name() != "process outbox.event.Order" || s.Status().Description != "boom" {
		t.Fatalf("span kind %v name %q status %v", s.SpanKind(), s.Name(), s.Status())
	}
	if inHandler.SpanID() != s.SpanContext().SpanID() {
		t.Fatal("the handler's context does not carry the span")
	}
	attrs := map[string]string{}
	for _, a := range s.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["messaging.system"] != "nats" || attrs["messaging.message.id"] != "ev-1" || attrs["messaging.consumer.group.name"] != "billing" {
		t.Fatalf("attributes %v", attrs)
	}
}

// A durable consumer found with messages of an earlier owner unacknowledged
// is restarted at its first unacknowledged message; a clean one is kept.
func TestNATSRestartAt(t *testing.T) {
	for _, c := range []struct {
		pending, redelivered int
		floor                uint64
		start                uint64
		reset                bool
	}{{0, 0, 41, 0, false}, {3, 0, 41, 42, true}, {0, 2, 0, 1, true}} {
		info := &jsConsumerInfo{NumAckPending: c.pending, NumRedelivered: c.redelivered}
		info.AckFloor.Stream = c.floor
		if start, reset := restartAt(info); start != c.start || reset != c.reset {
			t.Errorf("pending %d redelivered %d floor %d: restart at %d %v, want %d %v", c.pending, c.redelivered, c.floor, start, reset, c.start, c.reset)
		}
	}
}

// Broker URLs choose the broker; a bad one says what is accepted.
func TestBrokerURL(t *testing.T) {
	for url, want := range map[string]brokerKind{"": kafkaBroker, "kafka://a:9092,b:9092": kafkaBroker, "nats://h:4222": natsBroker,
		"tls://h:4222": natsBroker, "amqp://u:p@h:5672/v": rabbitBroker, "amqps://h": rabbitBroker} {
		c := Config{Broker: url}
		got, err := c.brokerKind()
		if err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", url, got, err, want)
		}
	}
	c := Config{Broker: "kafka://a:9092, b:9092"}
	if _, _ = c.brokerKind(); !slices.Equal(c.Brokers, []string{"a:9092", "b:9092"}) {
		t.Errorf("kafka:// brokers %q", c.Brokers)
	}
	for _, bad := range []string{"redis://h", "h:9092"} {
		c := Config{Broker: bad}
		if _, err := c.brokerKind(); err == nil || !strings.Contains(err.Error(), "amqp://") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	_ = time.Second
}

type pgxTx = pgx.Tx
type jsConsumerInfo = jetstream.ConsumerInfo

// A process that dies on an event, start after start (here: its context
// ends while the handler runs), gets it parked once MaxAttempts attempts
// died on it; the events after it in the same batches, never attempted by
// the dead processes, are applied, not parked.
func TestCrashLoopCountsOnlyAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		dying := make(chan struct{}, 1)
		s := &settings{name: "t", batch: 10, maxAttempts: 3, minBackoff: time.Millisecond, maxBackoff: time.Second,
			handler: func(ctx context.Context, _ pgx.Tx, ev *Event) error {
				if ev.ID == "oom" {
					dying <- struct{}{}
					<-ctx.Done() // the process dies here
					return ctx.Err()
				}
				db.effect(ev)
				return nil
			}}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		deaths := 0
		for ; deaths < 10; deaths++ {
			p := newPartition("orders", 0, s, db, func(*Event) {}, nil, log)
			ctx, die := context.WithCancel(t.Context())
			go p.run(ctx)
			p.push(keyed("k1:a", "k2:oom", "k3:b", "k4:c"), 4)
			synctest.Wait()
			died := false
			select {
			case <-dying:
				died = true
			default:
			}
			die()
			synctest.Wait()
			if !died {
				break
			}
		}
		_, effects := db.snapshot()
		if !slices.Equal(effects, []string{"a", "b", "c"}) {
			t.Fatalf("effects %q, want a b c once each", effects)
		}
		if len(db.parked) != 1 || !strings.Contains(db.parked["oom"], "ended 3 times") {
			t.Fatalf("parked %v, want only oom, after 3 attempts died", db.parked)
		}
		if deaths != s.maxAttempts+1 {
			t.Fatalf("%d processes died before oom was parked, want MaxAttempts+1 (%d): one on the batch, then one per counted attempt", deaths, s.maxAttempts+1)
		}
	})
}
