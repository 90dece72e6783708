package brokers

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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

// A RabbitMQ node with the management plugin: a classic queue bound to the
// exchange is named (and its type) at startup; an exchange whose only
// queue is a quorum queue gets no warning once the check has run.
func TestRabbitMQDurabilityWarning(t *testing.T) {
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	node := harness.RabbitMQForTest(t, fmt.Sprintf("management.tcp.port = %d", port), "management.tcp.ip = 127.0.0.1")
	api := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitManagement(t, api)

	t.Run("classic", func(t *testing.T) {
		b := newRabbitBroker(t, node, "#") // a durable classic queue
		f := newFixture(t, b)
		f.startRelay("--rabbitmq-management-url", api)
		if err := harness.WaitStatus(f.ctx, f.last.Proc, f.last.http, "durability_warnings", func(st map[string]any) bool {
			return st["durability_warnings"] != nil
		}); err != nil {
			t.Fatal(err)
		}
		f.checkDurabilityWarnings("queue " + b.exchange + ": queue " + b.exchange + " is a classic queue")
	})
	t.Run("quorum", func(t *testing.T) {
		b := newRabbitBroker(t, node) // its classic queue stays unbound
		ch := node.Channel(t)
		q := b.exchange + ".quorum"
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "#", b.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		f := newFixture(t, b)
		f.startRelay("--rabbitmq-management-url", api)
		f.waitConfirmed(f.commit(ev(1, "k1")), 30*time.Second)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(f.last.Log(), `msg="rabbitmq: checked the queues bound to the exchange" exchange=`+b.exchange+` queues=1`) {
			if time.Now().After(deadline) {
				t.Fatalf("no check of the exchange's one queue in the log:\n%s", tail(f.last.Log(), 3000))
			}
			time.Sleep(20 * time.Millisecond)
		}
		f.checkDurabilityWarnings()
	})
}

// waitManagement polls the management API until it answers.
func waitManagement(t *testing.T, api string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		req, _ := http.NewRequest(http.MethodGet, api+"/api/overview", nil)
		req.SetBasicAuth("guest", "guest")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("management API %s does not answer: %v", api, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
