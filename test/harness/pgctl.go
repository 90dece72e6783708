package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

// Start starts the server again after Stop; it is a no-op when running.
// It returns once the server accepts connections.
func (p *Postgres) Start(ctx context.Context) error {
	if p.External() {
		return p.errExternal("start")
	}
	if p.ctr != nil {
		return p.dockerStart(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isRunning(ctx) {
		return nil
	}
	return p.start(ctx)
}

func (p *Postgres) start(ctx context.Context) error {
	cmd := p.user.command(ctx, p.root, pgBinary("pg_ctl"), "start", "-w", "-t", "120", "-D", p.dataDir, "-l", p.LogFile())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl start: %w\n%s\nlog tail:\n%s", err, out, p.logTail(4096))
	}
	return p.waitReady(ctx)
}

// Stop shuts the server down with pg_ctl stop -m fast. Stopping a stopped
// server is a no-op.
func (p *Postgres) Stop(ctx context.Context) error {
	if p.External() {
		return p.errExternal("stop")
	}
	if p.ctr != nil {
		return p.dockerStop(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stop(ctx, "fast")
}

func (p *Postgres) stop(ctx context.Context, mode string) error {
	if !p.isRunning(ctx) {
		return nil
	}
	cmd := p.user.command(ctx, p.root, pgBinary("pg_ctl"), "stop", "-w", "-t", "120", "-D", p.dataDir, "-m", mode)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w\n%s", mode, err, out)
	}
	return nil
}

// isRunning asks pg_ctl status; any failure (including a missing data dir)
// counts as not running. It ignores ctx cancellation so that a cancelled
// ctx cannot make a running server look stopped.
func (p *Postgres) isRunning(ctx context.Context) bool {
	if p.dataDir == "" {
		return false
	}
	cmd := p.user.command(context.WithoutCancel(ctx), p.root, pgBinary("pg_ctl"), "status", "-D", p.dataDir)
	return cmd.Run() == nil
}

// Restart stops the server with the given pg_ctl shutdown mode ("fast" or
// "immediate"; immediate forces crash recovery) and starts it again on the
// same port and data dir, returning once it accepts connections.
func (p *Postgres) Restart(ctx context.Context, mode string) error {
	if p.External() {
		return p.errExternal("restart")
	}
	if mode != "fast" && mode != "immediate" && mode != "smart" {
		return fmt.Errorf("postgres restart: unknown mode %q (want fast or immediate)", mode)
	}
	if p.ctr != nil {
		return p.dockerRestart(ctx, mode)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.stop(ctx, mode); err != nil {
		return err
	}
	return p.start(ctx)
}

// Close stops the server and removes its temp dir. It never fails: it is
// meant for cleanup. Close on an external server does nothing.
func (p *Postgres) Close() {
	if p.External() {
		return
	}
	if p.ctr != nil {
		p.dockerClose()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaper != nil {
		p.reaper.disarm()
		p.reaper = nil
	}
	if err := p.stop(ctx, "fast"); err != nil {
		_ = p.stop(ctx, "immediate")
	}
	if p.root != "" {
		_ = os.RemoveAll(p.root)
	}
}

// waitReady polls until a connection to the admin database succeeds.
func (p *Postgres) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var lastErr error
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(attempt, p.DSN(p.adminDB))
		cancelAttempt()
		if err == nil {
			return conn.Close(ctx)
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for postgres to accept connections: %w (last error: %w)", ctx.Err(), lastErr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// logTail returns up to n trailing bytes of the server log.
func (p *Postgres) logTail(n int64) string {
	if p.LogFile() == "" {
		return ""
	}
	return fileTail(p.LogFile(), n)
}

func fileTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, 0)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}
