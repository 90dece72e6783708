package brokers

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/fault"
	"github.com/outboxd/outboxd/test/harness"
)

// proxied is a broker outboxd can be pointed at through a TCP proxy.
type proxied interface {
	// addr is the broker's client listener (host:port).
	addr() string
	// flagsVia are flags() with addr replaced by via.
	flagsVia(via string) []string
}

func (b *natsBroker) addr() string { return fmt.Sprintf("127.0.0.1:%d", b.srv.Port()) }
func (b *natsBroker) flagsVia(via string) []string {
	return []string{"--broker", "nats://" + via}
}

func (b *rabbitBroker) addr() string { return b.node.Addr() }
func (b *rabbitBroker) flagsVia(via string) []string {
	return []string{"--broker", "amqp://guest:guest@" + via + "/", "--rabbitmq-exchange", b.exchange}
}

// TestNetworkFaults puts a TCP proxy (test/fault's) between outboxd and
// the broker while one writer commits for the whole run:
//
//   - connection cut: the proxy resets every connection and refuses new
//     ones for 2 s, then passes again; outboxd reconnects and confirms
//     past the cut;
//   - black hole: the proxy stops forwarding without closing anything
//     (a partition that drops packets). outboxd must notice it on its own:
//     /readyz goes not-ready within 10 s, and the slot is not confirmed
//     past the WAL position at the start of the black hole while it lasts:
//     3 s past not-ready, or with -long 20 s (more than the heartbeat
//     timeouts, 15 s for RabbitMQ and 10 to 15 s for NATS, so the sink's
//     connection is dropped and redialled into the black hole meanwhile);
//   - restore: the proxy passes again; /readyz is ready again and the
//     slot is confirmed past the last commit.
//
// At the end every committed event is at the broker, first occurrences in
// commit order per aggregate, and (NATS) none twice.
func TestNetworkFaults(t *testing.T) {
	forEachBroker(t, false, func(t *testing.T, f *fixture) {
		pb, ok := f.b.(proxied)
		if !ok {
			t.Skip("no proxy for this broker")
		}
		proxy, err := fault.NewProxy("broker", pb.addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proxy.Close)
		f.via = pb.flagsVia(proxy.Addr())
		r := f.startRelay("--replication-timeout", "5s")
		w := startWriter(f)

		w.waitMore(f, 50)
		t.Logf("fault: connection cut for 2 s (committed so far: %d)", w.count())
		proxy.Cut(2 * time.Second)
		var start time.Time // of the black hole
		w.waitMore(f, 50)
		f.waitConfirmed(f.walLSN(), 60*time.Second)

		w.waitMore(f, 50)
		hole := func(notReady time.Duration) bool { return notReady == 0 || time.Since(start) < notReady+3*time.Second }
		if *long {
			hole = func(time.Duration) bool { return time.Since(start) < 20*time.Second }
		}
		t.Logf("fault: black hole (committed so far: %d)", w.count())
		proxy.Stall()
		// Nothing committed from here on can reach the broker, so the
		// slot may not be confirmed past this position while it lasts.
		holeAt := f.walLSN()
		start = time.Now()
		notReady := time.Duration(0)
		for hole(notReady) && time.Since(start) < 20*time.Second {
			if s := f.slotState(); s.ConfirmedFlushLSN > holeAt {
				t.Fatalf("confirmed_flush_lsn %s passed %s, the WAL position when the broker was black-holed", harness.FormatLSN(s.ConfirmedFlushLSN), harness.FormatLSN(holeAt))
			}
			if notReady == 0 && !ready(t, f.ctx, r.http) {
				notReady = time.Since(start)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// The monitor pings the broker every --poll-interval (500 ms
		// here), and a ping is a round trip to the server: 10 s is
		// twenty of them (main before the RabbitMQ round trip: 15.8 s).
		if notReady == 0 || notReady > 10*time.Second {
			t.Fatalf("/readyz went not ready %s into the black hole (0: not in 20 s); want within 10 s", notReady.Round(time.Millisecond))
		}
		t.Logf("/readyz not ready %s into the black hole, which lasted %s (committed so far: %d)", notReady.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), w.count())
		proxy.Pass()
		w.waitMore(f, 50)
		committed := w.stop(t)
		f.waitConfirmed(f.walLSN(), 90*time.Second)
		for !ready(t, f.ctx, r.http) {
			if f.ctx.Err() != nil {
				t.Fatal("/readyz not ready again after the black hole ended")
			}
			time.Sleep(50 * time.Millisecond)
		}
		dups := f.checkCommitted(f.read(f.topic(), len(committed)), committed)
		t.Logf("%d events committed under a connection cut and a black hole: 0 lost, 0 out of order, %d duplicates reached the consumer", len(committed), dups)
	})
}

// ready reports whether outboxd's /readyz answers 200 (and fails the test
// if it does not answer at all).
func ready(t *testing.T, ctx context.Context, addr string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("/readyz: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
