package bench

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// TestHogsStartAndDie: -hogs starts stress-ng with one worker per hog,
// whose CPU the split can read, and close leaves none of them running.
func TestHogsStartAndDie(t *testing.T) {
	if testing.Short() {
		t.Skip("burns a core for a moment")
	}
	h, err := startHogs(context.Background(), 1, time.Minute, t.TempDir())
	if err != nil {
		t.Skip(err) // no stress-ng on this machine
	}
	defer h.close()
	var pids map[int]time.Duration
	for deadline := time.Now().Add(10 * time.Second); len(pids) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stress-ng --cpu 1: %d processes after 10 s, want itself and a worker", len(pids))
		}
		pids = h.pids()
	}
	h.close()
	// SIGKILL is delivered asynchronously: wait for every process to go.
	for pid := range pids {
		for deadline := time.Now().Add(10 * time.Second); alive(pid) && syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d of stress-ng still runs 10 s after close", pid)
			}
		}
	}
}
