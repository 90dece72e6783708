package brokers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/test/harness"
)

// durabilityWarnings is /status's durability_warnings of the outboxd the
// fixture started last: what it found that lets the broker lose events it
// acknowledged (issue 31 item 7).
func (f *fixture) durabilityWarnings() []string {
	f.t.Helper()
	st, err := harness.Status(f.ctx, f.last.http)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	if list, ok := st["durability_warnings"].([]any); ok {
		for _, w := range list {
			out = append(out, fmt.Sprint(w))
		}
	}
	return out
}

// checkDurabilityWarnings: the warnings are exactly one per prefix in want
// (in any order), each also in outboxd's log at level WARN, once.
func (f *fixture) checkDurabilityWarnings(want ...string) {
	f.t.Helper()
	got := f.durabilityWarnings()
	for _, p := range want {
		i := slices.IndexFunc(got, func(w string) bool { return strings.HasPrefix(w, p) })
		if i < 0 {
			f.t.Fatalf("no durability warning starting %q on /status; got %q", p, got)
		}
		dest, _, _ := strings.Cut(got[i], ": ")
		log := f.last.Log()
		if n := strings.Count(log, `destination="`+dest+`"`); n != 1 || !strings.Contains(log, `level=WARN msg="the broker can lose events it acknowledged`) {
			f.t.Fatalf("durability warning for %s in the log %d times at WARN, want once:\n%s", dest, n, tail(log, 3000))
		}
	}
	if len(got) != len(want) {
		f.t.Fatalf("durability warnings on /status: %q; want one per %q", got, want)
	}
}

// A single nats-server and streams of one replica (the defaults): outboxd
// names the stream it published to and --nats-stream-replicas; the
// three-node cluster with R3 streams (TestNATSClusterRouting) has none.
func TestNATSDurabilityWarning(t *testing.T) {
	b := &natsBroker{srv: harness.NATSForTest(t)}
	f := newFixture(t, b)
	f.startRelay()
	f.waitConfirmed(f.commit(ev(1, "k1")), 30*time.Second)
	f.checkDurabilityWarnings("stream "+nats.StreamName(f.topic())+": ", "streams outboxd creates: --nats-stream-replicas is 1")
}
