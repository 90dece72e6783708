package outboxd

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// The boundary check meets the checkpoint's own transaction on the same
// WAL, and reports a gap for a WAL that passes the checkpoint without it
// (exactlyonce.go, boundary). Positions: the checkpoint's transaction (xid 745,
// committed at t0) commits at 0x900 and ends at 0x950; a step's transaction
// is that one unless it says otherwise.
func TestBoundary(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 11, 0, 0, 123456000, time.UTC)
	type step struct {
		kind string // begin, commit, idle; begin', commit': another transaction, the same xid committed a second later
		lsn  wal.LSN
	}
	whole, split := sink.Checkpoint{LSN: 0x950, Xid: 745, CommitTime: t0.UnixMicro()}, sink.Checkpoint{LSN: 0x900, Events: 2, Xid: 745, CommitTime: t0.UnixMicro()}
	probe := sink.Checkpoint{LSN: 0x900, Xid: 745, CommitTime: t0.UnixMicro()}
	for _, tc := range []struct {
		name  string
		at    sink.Checkpoint
		steps []step
		gapAt int // index of the step that reports the gap; -1: none
		seen  bool
	}{
		{"same WAL", whole, []step{{"begin", 0x100}, {"commit", 0x180}, {"idle", 0x800}, {"begin", 0x900}, {"commit", 0x950}, {"idle", 0x2000}}, -1, true},
		{"same WAL, split", split, []step{{"begin", 0x900}, {"commit", 0x950}, {"idle", 0x2000}}, -1, true},
		{"restored: WAL passes without it", whole, []step{{"begin", 0x300}, {"commit", 0x380}, {"idle", 0x2000}}, 2, false},
		{"restored: keepalive at the checkpoint", whole, []step{{"idle", 0x950}}, 0, false},
		{"restored: a transaction across it", whole, []step{{"begin", 0x940}, {"commit", 0x990}}, 1, false},
		{"restored: a transaction after it", whole, []step{{"begin", 0x960}}, 0, false},
		{"restored, split: another commit there", split, []step{{"begin", 0x901}}, 0, false},
		{"restored, split: WAL passes", split, []step{{"idle", 0x901}}, 0, false},
		{"same WAL, committed before a probe at its first event", probe, []step{{"begin", 0x100}, {"commit", 0x180}, {"begin", 0x900}}, -1, true},
		{"same WAL, probe: a concurrent transaction ends where its COMMIT starts", probe, []step{{"begin'", 0x800}, {"commit'", 0x900}, {"begin", 0x900}}, -1, true},
		// Issue 31 item 1: a restored server running the same shape of
		// workload writes a transaction with the same xid ending at the
		// same LSN; only its commit time differs.
		{"restored: the same xid ends at the checkpoint", whole, []step{{"begin'", 0x900}, {"commit'", 0x950}, {"idle", 0x950}}, 2, false},
		{"restored: the same xid ends at the checkpoint, more follows", whole, []step{{"begin'", 0x900}, {"commit'", 0x950}, {"begin'", 0x990}}, 2, false},
		{"restored, split: the same xid commits there", split, []step{{"begin'", 0x900}}, 0, false},
		{"restored, probe: the same xid commits there", probe, []step{{"begin'", 0x900}}, 0, false},
		{"not yet", whole, []step{{"begin", 0x100}, {"commit", 0x900}, {"idle", 0x94f}}, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBoundary("s", tc.at, 0x80)
			if b.capped(0x5000) != 0x80 {
				t.Fatalf("capped before the boundary: %s, want the start 0/80", b.capped(0x5000))
			}
			gapAt := -1
			for i, s := range tc.steps {
				var err error
				at := t0
				if strings.HasSuffix(s.kind, "'") {
					at = t0.Add(time.Second)
				}
				switch strings.TrimSuffix(s.kind, "'") {
				case "begin":
					err = b.begin(s.lsn, 745, at)
				case "commit":
					err = b.commit(s.lsn, 745, at)
				case "idle":
					err = b.idle(s.lsn)
				}
				var g *boundaryGap
				if err != nil {
					if !errors.As(err, &g) {
						t.Fatalf("step %d: %v", i, err)
					}
					gapAt = i
					break
				}
			}
			if gapAt != tc.gapAt || b.seen != tc.seen {
				t.Fatalf("gap at step %d, seen %v; want %d, %v", gapAt, b.seen, tc.gapAt, tc.seen)
			}
			if tc.seen && b.capped(0x5000) != 0x5000 {
				t.Fatalf("still capped after the boundary: %s", b.capped(0x5000))
			}
		})
	}
	if newBoundary("s", whole, 0x950) != nil || newBoundary("s", sink.Checkpoint{}, 0) != nil {
		t.Fatal("a session starting at or after the checkpoint has nothing to check")
	}
	var none *boundary
	if none.begin(1, 1, t0) != nil || none.commit(1, 1, t0) != nil || none.idle(1) != nil || none.capped(7) != 7 {
		t.Fatal("a nil boundary checks nothing")
	}
}

// A checkpoint of an earlier version names no transaction: a session that
// replays WAL before it skips nothing (publishes it all again, once) and
// checks no boundary; one that starts at or after it has nothing to skip.
// Never a skip on the LSN alone (issue 31 item 1).
func TestSessionCheckpointLegacy(t *testing.T) {
	var logged strings.Builder
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logged, io.Discard), nil))
	legacy := sink.Checkpoint{LSN: 0x950}
	skip, b := sessionCheckpoint(log, "s", legacy, 0x80)
	if skip != (sink.Checkpoint{}) || b != nil {
		t.Fatalf("legacy checkpoint replayed from before it: skip %v, boundary %v; want nothing skipped, no boundary", skip, b)
	}
	if !strings.Contains(logged.String(), "earlier version") {
		t.Fatalf("no warning: %q", logged.String())
	}
	if skip, b := sessionCheckpoint(log, "s", legacy, 0x950); skip != legacy || b != nil {
		t.Fatalf("legacy checkpoint, session at it: skip %v, boundary %v", skip, b)
	}
	named := sink.Checkpoint{LSN: 0x950, Xid: 745, CommitTime: 1}
	if skip, b := sessionCheckpoint(log, "s", named, 0x80); skip != named || b == nil || b.at != named {
		t.Fatalf("named checkpoint: skip %v, boundary %v; want it skipped behind a boundary", skip, b)
	}
}
