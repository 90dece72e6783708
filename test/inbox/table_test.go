package inbox_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// pythonWithPsycopg is the Python that runs examples/python: OUTBOXD_TEST_PYTHON
// (.ci/run points it at a venv) or python3; the test skips, saying how to
// get one, if it lacks psycopg 3.
func pythonWithPsycopg(t *testing.T) string {
	t.Helper()
	py := os.Getenv("OUTBOXD_TEST_PYTHON")
	if py == "" {
		py = "python3"
	}
	if out, err := exec.Command(py, "-c", "import psycopg").CombinedOutput(); err != nil {
		t.Skipf("the Python example needs python3 with psycopg 3 (%s: %v %s); fix: python3 -m venv ~/.venv-outboxd && ~/.venv-outboxd/bin/pip install -r examples/python/requirements.txt, then OUTBOXD_TEST_PYTHON=~/.venv-outboxd/bin/python",
			py, err, strings.TrimSpace(string(out)))
	}
	return py
}

// newTableWorld is a world whose dedupe records are the applied rows of
// inbox_events.
func newTableWorld(t *testing.T, within time.Duration, broker string) *world {
	w := newWorld(t, within, broker)
	w.inboxRows = `SELECT count(*) FROM inbox_events WHERE consumer = 'billing' AND applied_at IS NOT NULL`
	return w
}

// startDeliverer runs outboxd inbox named name (its application_name in the
// billing database) with --batch batch, and waits until it consumes.
func (w *world) startDeliverer(name string, batch int, extra ...string) {
	w.t.Helper()
	args := []string{"inbox", "--group", "billing", "--postgres", w.billingDSN + "&application_name=" + name,
		"--create-tables", "--batch", fmt.Sprint(batch), "--shutdown-timeout", "10s"}
	// 6s: how long a killed instance's events wait for the next one, as
	// for the billing consumers (startConsumer).
	switch {
	case w.kafka != nil:
		args = append(args, "--broker", "kafka://"+strings.Join(w.kafka.Brokers(), ","), "--topics", "outbox.event.Order", "--kafka-session-timeout", "6s")
	case w.nats != nil:
		args = append(args, "--broker", w.nats.URL(), "--topics", "outbox.event.Order", "--nats-ack-wait", "6s")
	default:
		args = append(args, "--broker", w.rabbit.URL(), "--topics", billingQueue)
	}
	args = append(args, extra...)
	w.startConsumerProc(name, outboxdBin, args, "inbox: consuming")
}

// startWorker runs the Python example (examples/python/worker.py) named name.
func (w *world) startWorker(py, name string, batch int, extra ...string) {
	w.t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		w.t.Fatal(err)
	}
	args := []string{filepath.Join(root, "examples", "python", "worker.py"), "--postgres", w.billingDSN,
		"--application-name", name, "--create-tables", "--batch", fmt.Sprint(batch), "--effect-delay", "0.002"}
	args = append(args, extra...)
	w.startConsumerProc(name, py, args, "applying events")
}

func (w *world) startConsumerProc(name, bin string, args []string, ready string) {
	w.t.Helper()
	p := w.spawn(name, bin, args)
	ctx, cancel := context.WithTimeout(w.ctx, 60*time.Second)
	defer cancel()
	if err := p.WaitLog(ctx, ready); err != nil {
		w.t.Fatalf("%s did not start: %v\n%s", name, err, tail(p.Log(), 3000))
	}
}

// TestTableEffectsExactlyOnce is the effect test in table-delivery mode, on
// each broker: outboxd → broker → outboxd inbox (a separate process) →
// inbox_events → two Python workers (examples/python, the shipped SQL) →
// ledger. outboxd inbox is SIGKILLed mid-transaction and restarted, a second
// one joins (Kafka: a rebalance; NATS and RabbitMQ: a standby) and the first
// is SIGKILLed again, a worker is SIGKILLed mid-transaction, outboxd is
// SIGKILLed (a resend). Every committed order is charged exactly once, in
// per-account order; inbox_events holds one applied row per committed order
// and package inbox's claim table nothing.
func TestTableEffectsExactlyOnce(t *testing.T) {
	py := pythonWithPsycopg(t)
	for _, broker := range []string{"kafka", "nats", "rabbitmq"} {
		t.Run(broker, func(t *testing.T) { testTableEffectsExactlyOnce(t, py, broker) })
	}
}

func testTableEffectsExactlyOnce(t *testing.T, py, broker string) {
	w := newTableWorld(t, 4*time.Minute, broker)
	w.startRelay()
	w.startDeliverer("d1", 1)
	w.startWorker(py, "p1", 1)
	w.startWorker(py, "p2", 4)

	stopProducing := w.startProducing(7)
	defer stopProducing()

	step := func(what string) { t.Logf("%s (effects so far %d)", what, w.applied()) }
	w.handOver(step, w.startDeliverer, "d1", "d2", 100)

	step("SIGKILL Python worker p1 mid-transaction: p2 goes on alone, then p1 returns")
	w.killMidTransaction("p1")
	w.progress(30, "p2 alone")
	w.startWorker(py, "p1", 1)
	w.progress(30, "p1 back")

	step("SIGKILL outboxd, restart it (it resends what it had not confirmed)")
	w.killRelay()
	w.progress(30, "after the outboxd restart")

	stopProducing()
	w.drainAndCheck()
	var claims, unapplied int
	if err := w.billing.QueryRow(w.ctx, `SELECT (SELECT count(*) FROM inbox), (SELECT count(*) FROM inbox_events WHERE applied_at IS NULL)`).Scan(&claims, &unapplied); err != nil {
		t.Fatal(err)
	}
	if claims != 0 || unapplied != 0 {
		t.Errorf("%d claim rows left in inbox (want 0: the event row is the only record), %d events unapplied", claims, unapplied)
	}

	// Retention: an outboxd inbox with a 1s --retention deletes every
	// applied row, and counts each once.
	addr := harness.FreeAddr(t)
	w.startDeliverer("d3", 1, "--retention", "1s", "--retention-interval", "100ms", "--http-addr", addr)
	left := -1
	for deadline := time.Now().Add(30 * time.Second); left != 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err := w.billing.QueryRow(w.ctx, `SELECT count(*) FROM inbox_events`).Scan(&left); err != nil {
			t.Fatal(err)
		}
	}
	if left != 0 {
		t.Fatalf("%d rows left in inbox_events 30s after a 1s retention", left)
	}
	w.mu.Lock()
	want := fmt.Sprintf(`outboxd_inbox_table_expired_total{consumer="billing"} %d`, len(w.committed))
	w.mu.Unlock()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(body), want+"\n") {
		t.Errorf("/metrics lacks %q (%v):\n%s", want, err, body)
	}
}

// TestTablePoisonParksAggregate: the Python worker cannot charge a frozen
// account, so that account's first order fails twice and is parked
// (inbox_failed); its later orders wait while every other account's are
// applied. Unfreezing it and inbox_release apply the waiting orders, in
// order, each once.
func TestTablePoisonParksAggregate(t *testing.T) {
	py := pythonWithPsycopg(t)
	w := newTableWorld(t, 3*time.Minute, "kafka")
	w.startRelay()
	w.startDeliverer("d1", 10)
	w.startWorker(py, "p1", 2, "--max-attempts", "2", "--backoff", "0.05")
	if _, err := w.billing.Exec(w.ctx, `INSERT INTO frozen_accounts VALUES ('acct-3')`); err != nil {
		t.Fatal(err)
	}
	stopProducing := w.startProducing(7)
	w.progress(200, "the other accounts")
	stopProducing()

	w.mu.Lock()
	others, frozen := 0, 0
	for _, o := range w.committed {
		if o.account == "acct-3" {
			frozen++
		} else {
			others++
		}
	}
	w.mu.Unlock()
	for deadline := time.Now().Add(60 * time.Second); w.applied() != others; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d effects, want the %d orders of the accounts not frozen", w.applied(), others)
		}
	}
	var parked, waiting, attempts int
	if err := w.billing.QueryRow(w.ctx, `SELECT count(*) FILTER (WHERE parked_at IS NOT NULL), count(*) FILTER (WHERE parked_at IS NULL AND applied_at IS NULL),
		coalesce(max(attempts), 0) FROM inbox_events WHERE aggregate = 'acct-3'`).Scan(&parked, &waiting, &attempts); err != nil {
		t.Fatal(err)
	}
	if parked != 1 || waiting != frozen-1 || attempts != 2 {
		t.Fatalf("acct-3: %d parked (want 1), %d waiting (want %d), %d attempts (want 2)", parked, waiting, frozen-1, attempts)
	}

	if _, err := w.billing.Exec(w.ctx, `DELETE FROM frozen_accounts`); err != nil {
		t.Fatal(err)
	}
	var released int
	if err := w.billing.QueryRow(w.ctx, `SELECT inbox_release('billing', 'acct-3')`).Scan(&released); err != nil || released != 1 {
		t.Fatalf("inbox_release = %d, %v; want 1", released, err)
	}
	w.drainAndCheck()
}
