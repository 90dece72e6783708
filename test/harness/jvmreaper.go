package harness

import (
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// jvmReaper is a shell child that SIGKILLs the JVM process groups whose ids
// are in DIR/*.pid and removes DIR once its stdin closes, i.e. once the test
// process is gone, however it went: JVMs the harness started never outlive
// the test binary.
type jvmReaper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
}

const jvmReaperScript = `read _; for f in "$1"/*.pid; do [ -f "$f" ] && kill -9 "-$(cat "$f")" 2>/dev/null; done; rm -rf "$1"`

// startJVMReaper starts the reaper of dir; name is its argv[0], for ps.
func startJVMReaper(name, dir string) (*jvmReaper, error) {
	cmd := exec.Command("/bin/sh", "-c", jvmReaperScript, name, dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return &jvmReaper{cmd: cmd, in: in}, nil
}

// close stops the reaper without letting it act: the caller has cleaned up.
func (r *jvmReaper) close() {
	if r == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	_ = r.in.Close()
}

// stopJVM stops proc with SIGTERM (killing it after two minutes); a JVM
// that exits on SIGTERM reports 128+15, which is a clean stop here.
func stopJVM(proc *Proc) error {
	err := proc.Stop(2 * time.Minute)
	if err != nil && strings.Contains(err.Error(), "exit code 143") {
		return nil
	}
	return err
}
