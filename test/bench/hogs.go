package bench

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// Hogs: -hogs N runs `stress-ng --cpu N` beside the whole run, as a CI
// machine is rarely idle. Issue 34's CPU-ratio targets must hold quiet
// and beside two such hogs: each hog takes a core's worth of CPU when it
// can, so outboxd and the walsender wake each other less promptly and
// read and send more per wake-up. The hogs' CPU is a column of its own in
// the CPU split (not "others"), so a run beside them is judged against
// the ratio targets, while other, unexplained load still marks it busy.

// hogs is the running stress-ng: its CPU is its workers' (its children).
type hogs struct {
	n    int
	proc *harness.Proc
}

// startHogs starts stress-ng with n CPU workers for at most limit (a
// backstop: Close kills them, and the bench's death kills stress-ng
// through Pdeathsig, its workers through their own).
func startHogs(ctx context.Context, n int, limit time.Duration, logDir string) (*hogs, error) {
	bin, err := exec.LookPath("stress-ng")
	if err != nil {
		return nil, fmt.Errorf("-hogs %d: stress-ng not found (apt-get install stress-ng): %w", n, err)
	}
	args := []string{"--cpu", strconv.Itoa(n), "--timeout", strconv.Itoa(int(limit.Seconds())+60) + "s", "--quiet"}
	p, err := harness.StartProc(ctx, "stress-ng", bin, args, nil, logDir)
	if err != nil {
		return nil, fmt.Errorf("-hogs %d: %w", n, err)
	}
	return &hogs{n: n, proc: p}, nil
}

// pids is stress-ng and its workers, each with its CPU time so far.
func (h *hogs) pids() map[int]time.Duration {
	if h == nil {
		return nil
	}
	m := children(h.proc.Pid())
	m[h.proc.Pid()] = cpuOf(h.proc.Pid())
	return m
}

func (h *hogs) close() {
	if h != nil {
		_ = h.proc.Kill()
	}
}

// hogsCommand is the settings line's description of -hogs n ("" for 0).
func hogsCommand(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf("stress-ng --cpu %d for the whole run (%d CPU hogs: their CPU is the split's \"hogs\", not \"others\"; the outboxd ÷ walsender targets are judged beside them)", n, n)
}
