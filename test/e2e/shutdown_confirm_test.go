package e2e

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// The final confirmation of a SIGTERM reaches the slot even when the
// walsender is blocked writing to outboxd, as it is when outboxd stopped
// reading to shut down (a frozen broker: the drain waits
// --shutdown-timeout) while the server kept sending. On main outboxd sent
// its final status update and closed the connection with WAL still unread
// in its socket: the kernel answered with a reset, the walsender failed its
// next write before it read the status update queued ahead of it, and
// exited without taking it; the slot stayed where the previous update had
// left it, and the next start sent everything since again (make soak
// at-least-once: a term-broker-stall re-sent 4,884 events; 3 of 5 SIGTERMs
// left the slot behind the logged confirmation). Here the only update that
// carries events 1-5's position is the final one (--confirm-interval and
// --status-interval far longer than the test), the in-flight window is one
// event (event 6, unacked behind the frozen broker), and a 20 MiB
// transaction fills the socket.
func TestShutdownConfirmationReachesTheSlot(t *testing.T) {
	k := harness.KafkaForTest(t)
	if k.External() {
		t.Skip("freezes the broker: needs the embedded one")
	}
	f := newFixture(t, withKafka(k))
	r := f.startRelay("--shutdown-timeout", "2s", "--confirm-interval", "1h", "--status-interval", "50s", "--replication-timeout", "60s",
		"--max-inflight-events", "1")
	before := f.slotState().ConfirmedFlushLSN
	acked := f.events(1, 5)
	// The progress record follows the acks: once it covers events 1-5, they
	// are acked and the final confirmation may pass them.
	poll(t, 30*time.Second, "events 1-5 in the progress record", func() bool { return f.progressLSN() >= acked })
	if err := k.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = k.Resume()
		}
	}()
	f.events(6, 6)
	poll(t, 30*time.Second, "event 6 in flight", func() bool { return r.metric(t, "outboxd_inflight_events") == 1 })
	f.exec(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT ('00000000-0000-0000-0001-' || lpad(i::text, 12, '0'))::uuid, $1, 'big', 'E',
			jsonb_build_object('pad', (SELECT string_agg(md5(random()::text || i || j), '') FROM generate_series(1, 16384) j))
		FROM generate_series(1, 40) i`, f.agg)
	if err := r.Signal(syscallSIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if code, err := r.Wait(ctx); err != nil || code != 0 {
		t.Fatalf("exit %d (%v)", code, err)
	}
	resumed = true
	if err := k.Resume(); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`msg=confirmed lsn=(\S+)`).FindAllStringSubmatch(r.Log(), -1)
	if len(m) == 0 {
		t.Fatalf("no final confirmation logged:\n%s", tailString(r.Log(), 3000))
	}
	final, err := harness.ParseLSN(m[len(m)-1][1])
	if err != nil {
		t.Fatal(err)
	}
	if final < acked {
		t.Fatalf("the final confirmation %s is before events 1-5 (%s)", harness.FormatLSN(final), harness.FormatLSN(acked))
	}
	got := f.waitSlotInactive(10 * time.Second).ConfirmedFlushLSN
	t.Logf("slot confirmed_flush_lsn %s before, %s after; final confirmation %s", harness.FormatLSN(before), harness.FormatLSN(got), harness.FormatLSN(final))
	if got < final {
		t.Fatalf("the slot's confirmed_flush_lsn is %s after the exit, before the final confirmation %s outboxd logged: the walsender never took it", harness.FormatLSN(got), harness.FormatLSN(final))
	}
}

// progressLSN is the confirmed_lsn of this slot's at-least-once progress
// record in outboxd.progress (0 if none yet).
func (f *fixture) progressLSN() uint64 {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	recs, err := harness.ReadCommitted(ctx, f.kafka.Brokers(), []string{"outboxd.progress"})
	if err != nil {
		return 0
	}
	key := f.systemID() + "/" + f.slot
	var lsn uint64
	for _, r := range recs {
		var v struct {
			LSN string `json:"confirmed_lsn"`
		}
		if string(r.Key) != key || json.Unmarshal(r.Value, &v) != nil {
			continue
		}
		if l, err := harness.ParseLSN(v.LSN); err == nil {
			lsn = l
		}
	}
	return lsn
}
