package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// maxLogBuffer bounds the in-memory copy of a process's output; the log
// file always has everything.
const maxLogBuffer = 1 << 20

// Proc is a child process whose stdout and stderr go to a log file and to a
// bounded in-memory buffer. It runs in its own process group, and gets
// SIGKILL if the test process dies, so it never outlives the tests.
type Proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	logFrom int64 // offset of this process's output in the log file
	buf     *tailBuffer

	done     chan struct{} // closed once the process was reaped
	exitCode int
	waitErr  error
}

// StartProc starts bin with args and env appended to the current
// environment. Output is appended to logDir/name.log. ctx only bounds the
// start: the process is not killed when ctx ends.
func StartProc(ctx context.Context, name, bin string, args []string, env []string, logDir string) (*Proc, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	if logDir == "" {
		return nil, fmt.Errorf("starting %s: empty log dir", name)
	}
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{name: name, logPath: logPath, logFile: f, logFrom: st.Size(), buf: &tailBuffer{max: maxLogBuffer}, done: make(chan struct{})}
	// The buffer first: once WaitLog sees output in the file, Log has it.
	out := io.MultiWriter(p.buf, f)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = out
	p.cmd.Stderr = out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Don't hang in Wait if a grandchild keeps the output pipe open.
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	go p.reap()
	return p, nil
}

func (p *Proc) reap() {
	err := p.cmd.Wait()
	switch ps := p.cmd.ProcessState; {
	case ps == nil: // never reaped
		p.exitCode, p.waitErr = -1, fmt.Errorf("waiting for %s: %w", p.name, err)
	case ps.Sys().(syscall.WaitStatus).Signaled():
		p.exitCode = 128 + int(ps.Sys().(syscall.WaitStatus).Signal())
	default:
		p.exitCode = ps.ExitCode()
	}
	p.logFile.Close()
	close(p.done)
}

// Pid is the process id (also its process group id).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// LogPath is the file holding the process output.
func (p *Proc) LogPath() string { return p.logPath }

// Signal sends sig to the process (not its group).
func (p *Proc) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signaling %s: %w", p.name, err)
	}
	return nil
}

// Freeze stops the process (SIGSTOP) and returns once every one of its
// threads is stopped. kill(2) only queues the signal: a thread running on
// the other core, or waiting for one under load, keeps working until the
// kernel gets to it, so a test that counts what a frozen broker answers
// would count those answers too. (Answers written to a socket before the
// stop are still read afterwards: the peer's receive buffer holds them.)
func (p *Proc) Freeze() error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		running, err := runningThreads(p.Pid())
		if err != nil || running == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freezing %s: %d threads still running 30 s after SIGSTOP", p.name, running)
		}
		select {
		case <-p.done:
			return fmt.Errorf("freezing %s: it exited", p.name)
		case <-time.After(time.Millisecond):
		}
	}
}

// runningThreads counts the threads of pid that are not stopped yet
// (state T in /proc/<pid>/task/<tid>/stat). A thread that exits between the
// listing and the read is not counted.
func runningThreads(pid int) (int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, fmt.Errorf("freezing pid %d: %w", pid, err)
	}
	n := 0
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue
		}
		// "tid (comm) S ...": comm may hold spaces and parentheses, so
		// the state is the field after the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			continue
		}
		if st := b[i+2]; st != 'T' && st != 't' && st != 'Z' && st != 'X' {
			n++
		}
	}
	return n, nil
}

// Kill sends SIGKILL to the whole process group and waits until the
// process was reaped.
func (p *Proc) Kill() error {
	if err := syscall.Kill(-p.Pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing %s: %w", p.name, err)
	}
	<-p.done
	return nil
}

// Wait waits for the process to exit and returns its exit code; a process
// killed by a signal reports 128+signal, like a shell. A non-zero exit is
// not an error; err is set only when ctx ends first or waiting failed.
func (p *Proc) Wait(ctx context.Context) (int, error) {
	select {
	case <-p.done:
		return p.exitCode, p.waitErr
	case <-ctx.Done():
		return -1, fmt.Errorf("waiting for %s to exit: %w", p.name, ctx.Err())
	}
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitLog polls the process output every 20ms until it contains substr.
// It fails early if the process exits without printing substr.
func (p *Proc) WaitLog(ctx context.Context, substr string) error {
	f, err := os.Open(p.logPath)
	if err != nil {
		return fmt.Errorf("waiting for %q in %s log: %w", substr, p.name, err)
	}
	defer f.Close()
	if _, err := f.Seek(p.logFrom, io.SeekStart); err != nil {
		return fmt.Errorf("waiting for %q in %s log: %w", substr, p.name, err)
	}
	var window []byte // unmatched tail that may hold a prefix of substr
	chunk := make([]byte, 64<<10)
	for {
		exited := p.Exited() // checked before reading so no final output is missed
		for {
			n, err := f.Read(chunk)
			window = append(window, chunk[:n]...)
			if strings.Contains(string(window), substr) {
				return nil
			}
			if keep := len(substr) - 1; len(window) > keep {
				window = window[len(window)-keep:]
			}
			if n == 0 || err != nil {
				break
			}
		}
		if exited {
			code, _ := p.Wait(ctx)
			return fmt.Errorf("%s exited (code %d) before logging %q; log tail:\n%s", p.name, code, substr, tail(p.Log(), 4096))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %q in %s log: %w; log tail:\n%s", substr, p.name, ctx.Err(), tail(p.Log(), 4096))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Log returns the process output (at most the last 1 MiB; see LogPath).
func (p *Proc) Log() string { return p.buf.String() }

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, b...)
	if len(t.b) > 2*t.max { // trim rarely, not on every write
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b[max(0, len(t.b)-t.max):])
}

// Stop sends SIGTERM and waits up to timeout for a clean exit; a process that
// does not exit in time is killed. A non-zero exit code is an error carrying
// the end of the log.
func (p *Proc) Stop(timeout time.Duration) error {
	if err := p.Signal(syscall.SIGTERM); err != nil && !p.Exited() {
		_ = p.Kill()
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	code, err := p.Wait(ctx)
	if err != nil {
		_ = p.Kill()
		return fmt.Errorf("stopping %s: %w", p.name, err)
	}
	if code != 0 {
		return fmt.Errorf("stopping %s: exit code %d; log tail:\n%s", p.name, code, tail(p.Log(), 4096))
	}
	return nil
}

// haltProc halts the process *proc with halt and forgets it, holding mu
// throughout so that nothing starts or signals it meanwhile; with no
// process it does nothing. *proc is cleared before halt runs: a halt that
// fails leaves no half-stopped process to use, Start starts a new one.
func haltProc(mu *sync.Mutex, proc **Proc, halt func(*Proc) error) error {
	mu.Lock()
	defer mu.Unlock()
	p := *proc
	if p == nil {
		return nil
	}
	*proc = nil
	return halt(p)
}

// serverForTest starts a server with start, given at most timeout, for one
// test: a failed start fails the test, and when the test (and its subtests)
// ends the server is closed, after onFail has logged what explains a failed
// test (its log tails).
func serverForTest[S interface{ Close() }](t testing.TB, what string, timeout time.Duration, start func(context.Context) (S, error), onFail func(S)) S {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := start(ctx)
	if err != nil {
		t.Fatalf("starting %s: %v", what, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			onFail(s)
		}
		s.Close()
	})
	return s
}
