package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// TestDbzServerColumns runs the dbzserver case small on NATS and RabbitMQ:
// Debezium Server drains the same backlog as outboxd into the same
// destination (emptied first), exactly the backlog arrives, and its row
// is there. It needs the dist (.ci/debezium-server.sh: 780 MB from Maven
// Central, not fetched for a test run) and the Temurin 25 JDK.
func TestDbzServerColumns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, nats-server, a RabbitMQ node, outboxd and Debezium Server")
	}
	if !harness.DebeziumServerCached() {
		t.Skip("Debezium Server " + harness.DebeziumVersion + " is not unpacked in the harness's cache: run .ci/debezium-server.sh")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// The wait for Debezium Server's confirmation is the bench's two
	// minutes per broker; here the path runs with a short bound (it is
	// "not within" either way: Debezium Server confirms only on a later
	// flush), which keeps make test within its budget.
	defer func(w time.Duration) { dbzConfirmWait = w }(dbzConfirmWait)
	dbzConfirmWait = 5 * time.Second
	cfg := DefaultConfig(true)
	cfg.Cases = map[string]bool{"drain": true, "dbzserver": true}
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, kind := range OtherBrokers {
		t.Run(kind, func(t *testing.T) {
			if err := e.StartBroker(ctx, kind); err != nil {
				t.Fatal(err)
			}
			defer e.StopBroker()
			const events, perTxn = 2000, 10
			c := e.RelayCase(ctx, "dbzs_"+kind, events, perTxn, 200, 1, false, false)
			if c.Err != nil {
				t.Fatal(c.Err)
			}
			if len(c.DbzServer) != 1 {
				t.Fatalf("%d Debezium Server runs, want 1", len(c.DbzServer))
			}
			d := c.DbzServer[0]
			if d.Delivered != events || d.Elapsed <= 0 || d.CPU <= 0 || d.PeakRSS < 32<<20 {
				t.Errorf("Debezium Server run %+v: want exactly %d messages, its CPU and RSS", d, events)
			}
			// Read back in full: each relay keeps every aggregate's
			// commit order, nothing lost or repeated.
			want := OrderRun{Read: events}
			if len(c.OutboxdOrder) != 1 || c.OutboxdOrder[0] != want || d.Order != want {
				t.Errorf("read back: outboxd %+v, Debezium Server %+v; want %+v each", c.OutboxdOrder, d.Order, want)
			}
			// Every kill round ran to its end; outboxd lost nothing
			// and kept each aggregate's order (duplicates are allowed:
			// at-least-once).
			if len(c.Kills) != len(killSlots) {
				t.Fatalf("%d kill rounds, want %d", len(c.Kills), len(killSlots))
			}
			for _, k := range c.Kills {
				t.Logf("%s, %s killed: %s", k.Relay, k.Killed, killCell(k))
				if k.Err != "" || k.At < events/2 {
					t.Errorf("kill round %+v", k)
				}
				if k.Relay == "outboxd" && (!k.Complete || k.Order.Lost != 0 || k.Order.Violations != 0) {
					t.Errorf("outboxd's kill round %+v: want complete, nothing lost, in order", k)
				}
			}
			if r := dbzServerRows(c, kind); len(r) != 5 {
				t.Errorf("rows %q", r)
			} else {
				t.Logf("%s: %q", kind, r)
			}
		})
	}
}

// TestCheckOrder judges a made-up read-back against a made-up commit
// order: a late event of an aggregate is a violation, a repeat a
// duplicate (not judged for order), an unread event lost.
func TestCheckOrder(t *testing.T) {
	// Commit order: 3 (a), 1 (b), 2 (a), 4 (b), 5 (a).
	ref, err := parseCommitOrder([]string{
		`table public.outbox: INSERT: id[uuid]:'00000000-0000-0000-0000-000000000003' aggregatetype[character varying]:'x' aggregateid[character varying]:'a' type[character varying]:'T' payload[jsonb]:'{"seq": 3}'`,
		`table public.outbox: INSERT: id[uuid]:'x' aggregateid[character varying]:'b' payload[jsonb]:'{"seq": 1, "note": "n"}'`,
		`table public.outbox: INSERT: id[uuid]:'x' aggregateid[character varying]:'a' payload[jsonb]:'{"seq": 2}'`,
		`table public.outbox: INSERT: id[uuid]:'x' aggregateid[character varying]:'b' payload[jsonb]:'{"seq": 4}'`,
		`table public.outbox: INSERT: id[uuid]:'x' aggregateid[character varying]:'a' payload[jsonb]:'{"seq": 5}'`,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		read []int64
		want OrderRun
	}{
		{[]int64{3, 1, 2, 4, 5}, OrderRun{Read: 5}},
		{[]int64{1, 4, 3, 2, 5}, OrderRun{Read: 5}},                      // aggregates interleave freely
		{[]int64{2, 3, 1, 4, 5}, OrderRun{Read: 5, Violations: 1}},       // 3 after 2 (a)
		{[]int64{3, 1, 2, 3, 2, 4}, OrderRun{Read: 6, Dups: 2, Lost: 1}}, // 3 and 2 again, 5 never
		{[]int64{4, 1, 5, 3, 2}, OrderRun{Read: 5, Violations: 3}},       // 1 after 4; 3 and 2 after 5
	} {
		got, err := checkOrder(ref, c.read)
		if err != nil || got != c.want {
			t.Errorf("checkOrder(%v) = %+v, %v; want %+v", c.read, got, err, c.want)
		}
	}
	if _, err := checkOrder(ref, []int64{9}); err == nil {
		t.Error("an event the backlog does not hold: no error")
	}
	if _, err := parseCommitOrder([]string{`table public.outbox: INSERT: id[uuid]:'x' payload[jsonb]:'{}'`}); err == nil {
		t.Error("a line without seq or aggregateid: no error")
	}
	// Debezium Server's JSON converter writes the jsonb payload as a string.
	for body, want := range map[string]int64{`{"seq": 17, "total": 3}`: 17, `"{\"items\": 2, \"seq\": 42}"`: 42} {
		if got, ok := seqOf([]byte(body)); !ok || got != want {
			t.Errorf("seqOf(%s) = %d, %v; want %d", body, got, ok, want)
		}
	}
}

// TestDbzServerRowsOrder renders made-up runs: the order row sums each
// relay's read-backs; the confirmation row is each relay's slowest run,
// and a run that never confirmed says so with the bound; the kill rounds
// are one row per fault, outboxd's beside Debezium Server's.
func TestDbzServerRowsOrder(t *testing.T) {
	c := RelayCase{Backlog: backlog{Events: 1000},
		Relays:       []RelayRun{{Elapsed: time.Second}},
		OutboxdOrder: []OrderRun{{Read: 1000}, {Read: 1000}},
		DbzServer: []DbzServerRun{{Elapsed: 2 * time.Second, Order: OrderRun{Read: 1000, Violations: 2}, ConfirmWait: dbzConfirmWait, ConfirmedOK: true, ConfirmedIn: 5 * time.Millisecond},
			{Elapsed: 3 * time.Second, Order: OrderRun{Read: 998, Lost: 2, Violations: 1}, ConfirmWait: dbzConfirmWait, ConfirmedIn: dbzConfirmWait}},
	}
	c.Kills = []KillRun{
		{Relay: "outboxd", Killed: KillRelay, At: 500, Complete: true, Order: OrderRun{Read: 1400, Dups: 400}},
		{Relay: "Debezium Server", Killed: KillRelay, At: 600, Complete: true, Order: OrderRun{Read: 1000, Lost: 0}},
		{Relay: "outboxd", Killed: KillBroker, At: 510, Complete: true, Order: OrderRun{Read: 1000}},
		{Relay: "Debezium Server", Killed: KillBroker, At: 520, Exited: true, Order: OrderRun{Read: 900, Lost: 100}},
	}
	r := dbzServerRows(c, KindNATS)
	if len(r) != 5 {
		t.Fatalf("rows %q", r)
	}
	if r[2][2] != "0 violations, 0 lost, 0 duplicates in 2,000 read" || r[2][3] != "3 violations, 2 lost, 0 duplicates in 1,998 read" ||
		!strings.Contains(r[2][1], "(2 + 2 runs)") {
		t.Errorf("order row %q", r[2])
	}
	if r[1][2] != "≤ 10 ms (poll interval)" || r[1][3] != "not within 120 s in 1 of 2 runs (offset.flush.interval.ms=0)" {
		t.Errorf("confirm row %q", r[1])
	}
	if r[3][2] != "0 lost, 400 duplicates, 0 order violations (killed at 500)" || r[3][3] != "0 lost, 0 duplicates, 0 order violations (killed at 600)" ||
		!strings.Contains(r[3][1], "SIGKILL of the relay") {
		t.Errorf("relay kill row %q", r[3])
	}
	if r[4][2] != "0 lost, 0 duplicates, 0 order violations (killed at 510); the relay recovered by itself" ||
		r[4][3] != "100 lost, 0 duplicates, 0 order violations (killed at 520); the relay exited (restarted by the bench); backlog not complete within 120 s" ||
		!strings.Contains(r[4][1], "SIGKILL of the broker") {
		t.Errorf("broker kill row %q", r[4])
	}
	if k := killCell(KillRun{Err: "boom\nmore"}); k != "not run to its end: ERROR: boom" {
		t.Errorf("killCell of an error: %q", k)
	}
	c.Relays = []RelayRun{{Elapsed: time.Second, KafkaAt: time.Second, ConfirmedAt: 1250 * time.Millisecond}}
	c.DbzServer[1].ConfirmedOK, c.DbzServer[1].ConfirmedIn = true, 40*time.Second
	if r := confirmRow(c); len(r) != 1 || r[0][2] != ms(250*time.Millisecond) || r[0][3] != ms(40*time.Second)+" (offset.flush.interval.ms=0)" {
		t.Errorf("confirm row %q", r)
	}
	// Runs that did not wait for their confirmation have no row.
	for i := range c.DbzServer {
		c.DbzServer[i].ConfirmWait = 0
	}
	if r := confirmRow(c); r != nil {
		t.Errorf("confirm row without a wait: %q", r)
	}
}
