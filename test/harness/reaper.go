package harness

import (
	"context"
	"fmt"
	"io"
	"os/exec"
)

// reaperScript waits for EOF on stdin, then stops the server and removes
// its temp dir. stdin is a pipe only the test process holds, so EOF means
// the test process is gone: this cleans up after a test binary that was
// killed or timed out without running its cleanups.
const reaperScript = `read _; "$3" stop -D "$1" -m immediate >/dev/null 2>&1; rm -rf "$2"`

// reaper is the watchdog child of a harness-started server.
type reaper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

func startReaper(u pgUser, dataDir, root string) (*reaper, error) {
	cmd := u.command(context.Background(), root, "/bin/sh", "-c", reaperScript, "outboxd-pg-reaper", dataDir, root, pgBinary("pg_ctl"))
	cmd.SysProcAttr.Setpgid = true // survive a Ctrl-C aimed at the test process
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("starting postgres reaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting postgres reaper: %w", err)
	}
	return &reaper{cmd: cmd, stdin: stdin}, nil
}

// disarm stops the reaper without letting it act.
func (r *reaper) disarm() {
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	_ = r.stdin.Close()
}
