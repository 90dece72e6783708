package outboxd

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// natsSink is a heldSink that names itself as sink/nats does.
type natsSink struct{ *heldSink }

func (natsSink) Name() string { return "nats" }

// namedHarness is the harness with its sink named "nats".
func namedHarness(t *testing.T, tweak func(*Config)) (*harness, natsSink) {
	h := newHarness(t, 100, tweak)
	ns := natsSink{h.sink}
	h.relay.sink, h.s.sink = ns, ns
	return h, ns
}

// The NATS sink's own refusal, as sink/nats words it (classify).
var natsTooLarge = &sink.Error{Kind: sink.Rejected, Err: errors.New("nats: maximum payload exceeded: raise the server's max_payload")}

// A NATS refusal is reported as NATS's, never Kafka's: under --on-invalid
// dead-letter the dead letter's outboxd.error header names nats and does
// not advise the mode that is on; under fail the hold names nats and
// advises dead-letter once.
func TestRejectionNamesTheBroker(t *testing.T) {
	h, ns := namedHarness(t, func(c *Config) { c.OnInvalid = OnInvalidDeadLetter })
	h.relay.poison[eventPos{commit: 200}] = natsTooLarge.Error()
	ns.probe = func(*router.Record) error { return natsTooLarge }
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1)
	dl := h.sink.records[0]
	if dl.Topic != "dlq" {
		t.Fatalf("produced to %s, want the dead-letter topic", dl.Topic)
	}
	var reason string
	for _, hd := range dl.Headers {
		if hd.Key == router.HeaderError {
			reason = string(hd.Value)
		}
	}
	if !strings.Contains(reason, "rejected by nats: nats: maximum payload exceeded") || strings.Contains(strings.ToLower(reason), "kafka") || strings.Contains(reason, "dead-letter") {
		t.Fatalf("outboxd.error %q: want the NATS refusal, without kafka or dead-letter advice", reason)
	}

	h, ns = namedHarness(t, nil) // --on-invalid fail
	h.relay.poison[eventPos{commit: 200}] = natsTooLarge.Error()
	ns.probe = func(*router.Record) error { return natsTooLarge }
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	var hold *holdError
	if err := h.loopErr(5 * time.Second); !errors.As(err, &hold) || hold.rec == nil {
		t.Fatalf("session error %v, want a hold with the record to retry", err)
	}
	if msg := hold.Error(); !strings.Contains(msg, "rejected by nats") || strings.Contains(strings.ToLower(msg), "kafka") {
		t.Fatalf("hold %q: want it to name nats, not kafka", msg)
	}
	var logs bytes.Buffer
	h.relay.log = slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.relay.hold(ctx, hold)
	if reason := logs.String(); !strings.Contains(reason, "rejected by nats") || strings.Count(reason, "--on-invalid dead-letter") != 1 || strings.Contains(strings.ToLower(reason), "kafka") {
		t.Fatalf("hold's reason (/readyz, the log) %q: want nats, the dead-letter advice once, no kafka", reason)
	}
}

// A full in-flight window that the broker does not drain says which broker.
func TestReleaseNamesTheBroker(t *testing.T) {
	h, _ := namedHarness(t, func(c *Config) {
		c.MaxInflightEvents = 1
		c.ReleaseAfter = 50 * time.Millisecond
	})
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	err := h.loopErr(5 * time.Second)
	if !errors.Is(err, errReleased) || !strings.HasPrefix(err.Error(), "nats acked nothing") {
		t.Fatalf("session error %v, want nats's release", err)
	}
}

// outboxd_reconnects_total has the configured broker's target from the
// start, under its own name: kafka only for Kafka.
func TestReconnectsLabelIsTheBrokers(t *testing.T) {
	rt, err := router.New(router.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Postgres: "postgres://x@127.0.0.1:1/db", Router: rt, Sink: natsSink{newHeldSink()}})
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(r.m.reconnects); n != 2 {
		t.Fatalf("%d reconnect series, want postgres and nats", n)
	}
	want := "\n# HELP outboxd_reconnects_total Reconnections, by target (postgres, and the broker: kafka, nats, rabbitmq).\n# TYPE outboxd_reconnects_total counter\n" +
		"outboxd_reconnects_total{target=\"nats\"} 0\noutboxd_reconnects_total{target=\"postgres\"} 0\n"
	if err := testutil.CollectAndCompare(r.m.reconnects, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
