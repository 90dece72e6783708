package sink

import (
	"testing"

	"github.com/outboxd/outboxd/wal"
)

func TestCheckpointText(t *testing.T) {
	for _, c := range []Checkpoint{{LSN: 0x16B3748}, {LSN: 0x1_0000_0010, Events: 12}} {
		got, err := ParseCheckpoint(c.String())
		if err != nil || got != c {
			t.Fatalf("%q → %v, %v", c.String(), got, err)
		}
	}
	for _, bad := range []string{"", "x", "0/10+0", "0/10+a"} {
		if _, err := ParseCheckpoint(bad); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
	split := Checkpoint{LSN: 100, Events: 2}
	for _, c := range []struct {
		commit wal.LSN
		n      int
		want   bool
	}{{99, 50, true}, {100, 0, true}, {100, 1, true}, {100, 2, false}, {101, 0, false}} {
		if got := split.Covers(c.commit, c.n); got != c.want {
			t.Fatalf("Covers(%d, %d) = %v", c.commit, c.n, got)
		}
	}
	whole := Checkpoint{LSN: 100}
	if !whole.Covers(99, 5) || whole.Covers(100, 0) {
		t.Fatal("a whole checkpoint covers the transactions committed before it, only")
	}
}
