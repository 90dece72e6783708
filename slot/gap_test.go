package slot

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

func TestCheckGap(t *testing.T) {
	known := Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 1}
	for _, c := range []struct {
		name  string
		known Progress
		found bool
		srv   server
		want  string // substring; "" = no gap
	}{
		{"fresh install: no record", Progress{}, false, server{systemID: "7321", flushed: 0x100}, ""},
		{"slot exists, server ahead", known, true, server{systemID: "7321", timeline: 2, flushed: 0x3000200}, ""},
		{"synced slot behind the record: duplicates, no gap", known, true, server{systemID: "7321", timeline: 2, flushed: 0x3000100}, ""},
		{"slot missing", known, false, server{systemID: "7321", timeline: 2, flushed: 0x9000000}, `replication slot "s" does not exist, but outboxd has confirmed it up to LSN 0/3000100 (system 7321, timeline 1)`},
		{"slot missing, exactly-once checkpoint without system id", Progress{LSN: 0x10}, false, server{systemID: "7321", flushed: 0x20}, "(system unknown, timeline 0)"},
		{"another cluster", known, true, server{systemID: "9999", flushed: 0x9000000}, "another cluster (system identifier 9999)"},
		{"server behind what was published", known, true, server{systemID: "7321", flushed: 0x3000000}, "the server's WAL ends at 0/3000000, before LSN 0/3000100"},
		{"promoted standby forked before what was published, WAL since past it", known, true,
			server{systemID: "7321", timeline: 2, flushed: 0x9000000, switched: 0x3000000}, "the server's timeline 2 forked from timeline 1 at 0/3000000, before LSN 0/3000100"},
		{"forked after what was published", known, true, server{systemID: "7321", timeline: 2, flushed: 0x9000000, switched: 0x3000100}, ""},
		{"restored to before the record's timeline", Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 3}, true,
			server{systemID: "7321", timeline: 2, flushed: 0x9000000, diverged: true}, "whose history does not contain timeline 3"},
		{"old slot-only key, another cluster's record: not ours", Progress{LSN: 0x3000100, SystemID: "9999", Timeline: 1, Legacy: true}, false,
			server{systemID: "7321", flushed: 0x100}, ""},
		{"old slot-only key, this cluster's record", Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 1, Legacy: true}, false,
			server{systemID: "7321", flushed: 0x9000000}, `replication slot "s" does not exist`},
		{"keepalives moved the record past the server's WAL end, no event there", Progress{LSN: 0x3000100, Published: 0x3000000, SystemID: "7321", Timeline: 1}, true,
			server{systemID: "7321", timeline: 1, flushed: 0x3000080}, ""},
		{"an event past the server's WAL end", Progress{LSN: 0x3000100, Published: 0x3000100, SystemID: "7321", Timeline: 1}, true,
			server{systemID: "7321", timeline: 1, flushed: 0x3000080}, "the server's WAL ends at 0/3000080, before LSN 0/3000100"},
		{"slot re-created beyond the write-ahead record", Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 1, WriteAhead: true}, true,
			server{systemID: "7321", timeline: 1, flushed: 0x9000000, slot: 0x3000200}, `replication slot "s" is confirmed up to 0/3000200, beyond LSN 0/3000100`},
		{"slot confirmed by outboxd publishing to another broker meanwhile: said so", Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 1, WriteAhead: true}, true,
			server{systemID: "7321", timeline: 1, flushed: 0x9000000, slot: 0x3000200}, "or an outboxd publishing this slot to another broker (each broker keeps its own record)"},
		{"a dropped slot says what to do", known, false, server{systemID: "7321", timeline: 2, flushed: 0x9000000}, "outboxd slot drop"},
		{"slot at the write-ahead record", Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 1, WriteAhead: true}, true,
			server{systemID: "7321", timeline: 1, flushed: 0x9000000, slot: 0x3000100}, ""},
		{"slot beyond an old-key record (written after confirming)", Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 1, WriteAhead: true, Legacy: true}, true,
			server{systemID: "7321", timeline: 1, flushed: 0x9000000, slot: 0x3000200}, ""},
		{"slot beyond the exactly-once checkpoint (keepalives confirm)", Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 1}, true,
			server{systemID: "7321", timeline: 1, flushed: 0x9000000, slot: 0x3000200}, ""},
	} {
		got := checkGap("s", c.known, c.found, c.srv)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: gap %q, want %q", c.name, got, c.want)
		}
	}
}

func TestWantFailover(t *testing.T) {
	for _, c := range []struct {
		mode    string
		version int
		want    bool
		err     string
	}{
		{"auto", 160004, false, ""},
		{"", 170000, true, ""},
		{"auto", 180004, true, ""},
		{"false", 180004, false, ""},
		{"true", 170004, true, ""},
		{"true", 160004, false, "--slot-failover true needs PostgreSQL 17 or later (failover slots); this server is 16.4"},
	} {
		got, err := wantFailover(c.mode, c.version)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("wantFailover(%q, %d) = %v, %v; want %v, %q", c.mode, c.version, got, err, c.want, c.err)
		}
	}
}

func TestSwitchPoint(t *testing.T) {
	h := "1\t0/3000000\tno recovery target specified\n\n2\t0/5000A0\tat restore point \"x\"\n"
	for _, c := range []struct {
		tli      int32
		want     wal.LSN
		diverged bool
	}{{1, 0x3000000, false}, {2, 0x5000A0, false}, {4, 0, true}} {
		if got, d := switchPoint(h, c.tli); got != c.want || d != c.diverged {
			t.Errorf("switchPoint(%d) = %s, %v; want %s, %v", c.tli, got, d, c.want, c.diverged)
		}
	}
}

// fakeProgress is a ProgressSource whose record the test sets, counting
// reloads.
type fakeProgress struct {
	rec, next Progress
	ok        bool
	err       error
	reloads   int
}

func (f *fakeProgress) Known() (Progress, bool) { return f.rec, f.ok }
func (f *fakeProgress) Reload(context.Context) error {
	f.reloads++
	if f.err != nil {
		return f.err
	}
	f.rec, f.ok = f.next, true
	return nil
}
func (f *fakeProgress) Accepted(string) {}

// A missing slot is created only on the record as Kafka has it now: the
// guard reloads it first (a standby that read it at its start, before the
// active wrote one, must not create a slot on "LSN 0"), and a record that
// cannot be read is no verdict.
func TestGuardReloadsBeforeCreating(t *testing.T) {
	srv := server{systemID: "7", timeline: 1, flushed: 0x9000}
	p := &fakeProgress{ok: true, next: Progress{LSN: 0x5000, SystemID: "7", Timeline: 1}}
	err := guard(context.Background(), nil, Config{Slot: "s", Progress: p}, false, srv)
	var se *SetupError
	if !errors.As(err, &se) || !strings.Contains(se.Problem, "does not exist, but outboxd has confirmed it up to LSN 0/5000") || p.reloads != 1 {
		t.Fatalf("missing slot after the active published: %v (%d reloads)", err, p.reloads)
	}
	p = &fakeProgress{ok: true, err: errors.New("kafka down")}
	if err := guard(context.Background(), nil, Config{Slot: "s", Progress: p}, false, srv); !errors.Is(err, errProgressUnknown) {
		t.Fatalf("unreadable record, missing slot: %v", err)
	}
	// An existing slot on the same server: no reload, no gap.
	p = &fakeProgress{ok: true, rec: Progress{LSN: 0x5000, SystemID: "7", Timeline: 1}}
	if err := guard(context.Background(), nil, Config{Slot: "s", Progress: p}, true, srv); err != nil || p.reloads != 0 {
		t.Fatalf("existing slot: %v (%d reloads)", err, p.reloads)
	}
	// A fresh install: nothing recorded anywhere, the slot may be created.
	p = &fakeProgress{}
	if err := guard(context.Background(), nil, Config{Slot: "s", Progress: p}, false, srv); err != nil || p.reloads != 1 {
		t.Fatalf("fresh install: %v (%d reloads)", err, p.reloads)
	}
}

// A walsender kill with two instances (issue 31 item 9): the standby takes
// the slot and publishes on, writing its progress record before it
// confirms; the former active, reconnecting, reads the slot (ahead of its
// own record: it reloads the record) and the server's WAL end. When it read
// the WAL end before the new active wrote the record it then reloads, the
// record named positions past that stale WAL end, and the former active
// exited with a false "phantom events" gap (TestFaultsHA, seed
// 1796200230756684415). The WAL end it compares must be read after the
// record: here the server's WAL end is 0/5000 when read before the reload,
// and 0/6100 after it, as on the real server.
func TestGuardComparesTheWALEndReadAfterTheRecord(t *testing.T) {
	own := Progress{LSN: 0x4000, Published: 0x4000, SystemID: "7", Timeline: 1, WriteAhead: true}
	newActive := Progress{LSN: 0x6000, Published: 0x6000, SystemID: "7", Timeline: 1, WriteAhead: true}
	for _, tc := range []struct {
		name    string
		after   uint64 // the WAL end once the record was reloaded
		wantGap string
	}{
		{"the new active's record, WAL past it", 0x6100, ""},
		{"a record past the WAL end read after it: a real gap", 0x5000, "the server's WAL ends at 0/5000, before LSN 0/6000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakeProgress{ok: true, rec: own, next: newActive}
			reads := 0
			srv := server{systemID: "7", timeline: 1, flushed: 0x5000, slot: 0x4100} // read before the reload
			srv.walEnd = func(context.Context) (wal.LSN, error) {
				reads++
				if p.reloads == 0 {
					return 0x5000, nil
				}
				return wal.LSN(tc.after), nil
			}
			err := guard(context.Background(), nil, Config{Slot: "s", Progress: p}, true, srv)
			if p.reloads != 1 {
				t.Fatalf("%d reloads, want 1 (the slot is ahead of the instance's own record)", p.reloads)
			}
			var se *SetupError
			switch {
			case tc.wantGap == "" && err != nil:
				t.Fatalf("false gap: %v", err)
			case tc.wantGap != "" && (!errors.As(err, &se) || !strings.Contains(se.Problem, tc.wantGap)):
				t.Fatalf("got %v, want the gap %q", err, tc.wantGap)
			case reads != 1:
				t.Fatalf("the WAL end was read %d times after the reload, want 1", reads)
			}
		})
	}
}
