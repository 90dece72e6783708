package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// --slot-failover: on PostgreSQL 17+ auto turns an existing ordinary slot
// into a failover slot and false creates an ordinary one; on older servers
// true is refused at startup, naming the version.
func TestSlotFailoverOption(t *testing.T) {
	f := newFixture(t)
	f.asSetupRole()
	version, err := harness.ServerVersionNum(f.ctx, f.conn)
	if err != nil {
		t.Fatal(err)
	}
	failover := func() bool {
		t.Helper()
		var on bool
		if err := f.conn.QueryRow(f.ctx, `SELECT coalesce((to_jsonb(s)->>'failover')::bool, false) FROM pg_replication_slots s WHERE slot_name = $1`, f.slot).Scan(&on); err != nil {
			t.Fatal(err)
		}
		return on
	}
	if version < 170000 {
		p, _ := f.spawn("--slot-failover", "true")
		ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
		defer cancel()
		code, err := p.Wait(ctx)
		if err != nil || code != 1 || !strings.Contains(p.Log(), "--slot-failover true needs PostgreSQL 17 or later (failover slots); this server is ") {
			t.Fatalf("exit %d, err %v; want exit 1 naming the version\n%s", code, err, p.Log())
		}
		r := f.startRelay() // auto: an ordinary slot
		if failover() || r.statusDoc(t)["failover"] != false {
			t.Errorf("auto made a failover slot on PostgreSQL %d", version/10000)
		}
		return
	}
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	if failover() {
		t.Fatal("a fresh pg_create_logical_replication_slot slot is already a failover slot")
	}
	r := f.startRelay() // auto
	if !failover() {
		t.Error("auto did not make the existing slot a failover slot")
	}
	if !strings.Contains(r.Log(), "failover=true") {
		t.Error("the streaming log line does not say failover=true")
	}
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second)
	f.exec(`SELECT pg_drop_replication_slot($1)`, f.slot)
	r = f.startRelay("--slot-failover", "false", "--accept-gap") // the dropped slot is a gap
	if failover() || r.statusDoc(t)["failover"] != false {
		t.Error("--slot-failover false created a failover slot")
	}
	if !strings.Contains(r.Log(), "gap accepted") {
		t.Error("recreating the dropped slot was not reported as an accepted gap")
	}
}

// In exactly-once mode the checkpoint is the progress record: a slot that
// vanished after outboxd confirmed it is a gap there too.
func TestGapExactlyOnceCheckpoint(t *testing.T) {
	f := newFixture(t)
	f.asSetupRole()
	args := []string{"--exactly-once", "--checkpoint-topic", "cp." + f.agg}
	r := f.startRelay(args...)
	end := f.commit(event{1, "a", "E", `{}`})
	f.waitConfirmed(end, 20*time.Second)
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second)
	f.exec(`SELECT pg_drop_replication_slot($1)`, f.slot)

	p, _ := f.spawn(args...)
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	code, err := p.Wait(ctx)
	if err != nil || code != 1 || !strings.Contains(p.Log(), `outboxd run: gap: replication slot "`+f.slot+`" does not exist, but outboxd has confirmed it up to LSN`) {
		t.Fatalf("exit %d, err %v; want exit 1 with the gap\n%s", code, err, p.Log())
	}
	var n int
	if err := f.conn.QueryRow(f.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&n); err != nil || n != 0 {
		t.Fatalf("slot recreated (%d, %v) despite the gap", n, err)
	}
	f.startRelay(append(args, "--accept-gap")...)
}
