package outboxd

import (
	"errors"
	"testing"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// The boundary check meets the checkpoint's own transaction on the same
// WAL, and reports a gap for a WAL that passes the checkpoint without it
// (boundary.go). Positions: the checkpoint's transaction commits at 0x900
// and ends at 0x950.
func TestBoundary(t *testing.T) {
	type step struct {
		kind string // begin, commit, idle
		lsn  wal.LSN
	}
	whole, split := sink.Checkpoint{LSN: 0x950}, sink.Checkpoint{LSN: 0x900, Events: 2}
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
		{"same WAL, committed before a probe at its first event", sink.Checkpoint{LSN: 0x900}, []step{{"begin", 0x100}, {"commit", 0x180}, {"begin", 0x900}}, -1, true},
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
				switch s.kind {
				case "begin":
					err = b.begin(s.lsn)
				case "commit":
					err = b.commit(s.lsn)
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
	if none.begin(1) != nil || none.commit(1) != nil || none.idle(1) != nil || none.capped(7) != 7 {
		t.Fatal("a nil boundary checks nothing")
	}
}
