package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby makes a streaming physical standby of p and starts it. The
// npm PostgreSQL builds carry no pg_basebackup, so it does what
// pg_basebackup does: a physical slot reserving WAL, pg_backup_start, a copy
// of the data directory without what pg_basebackup skips, and pg_backup_stop's
// backup_label. The standby streams through slot name (primary_slot_name),
// with hot_standby_feedback and, on PostgreSQL 17+, sync_replication_slots:
// failover slots are copied to it. On the docker backend the standby is a
// container that runs pg_basebackup itself (dockerstandby.go). Close it
// when done.
func (p *Postgres) StartStandby(ctx context.Context, name string) (*Postgres, error) {
	if p.External() {
		return nil, p.errExternal("standby")
	}
	conn, err := p.Connect(ctx, p.adminDB)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	version, err := ServerVersionNum(ctx, conn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, name); err != nil {
		return nil, fmt.Errorf("standby slot: %w", err)
	}
	if p.ctr != nil {
		return p.startDockerStandby(ctx, conn, name, version)
	}
	root, err := os.MkdirTemp("", "outboxd-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("creating standby temp dir: %w", err)
	}
	s := &Postgres{root: root, dataDir: filepath.Join(root, "data"), user: p.user, adminDB: "postgres"}
	if err := p.baseBackup(ctx, conn, s.dataDir); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.user.chown(s.root); err != nil {
		s.Close()
		return nil, err
	}
	if s.reaper, err = startReaper(s.user, s.dataDir, s.root); err != nil {
		s.Close()
		return nil, err
	}
	conf := [][2]string{
		{"unix_socket_directories", s.root},
		{"primary_conninfo", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=%s", p.port, name)},
		{"primary_slot_name", name},
		{"hot_standby", "on"},
		{"hot_standby_feedback", "on"},
	}
	if version >= 170000 {
		// synchronized_standby_slots is the primary's setting; a promoted
		// standby has no standby of its own to wait for.
		conf = append(conf, [2]string{"sync_replication_slots", "on"}, [2]string{"synchronized_standby_slots", ""})
	}
	// postgresql.auto.conf is read last: these (and the port, below) win
	// over the primary's ALTER SYSTEMs and its port.
	if err := appendConf(filepath.Join(s.dataDir, "postgresql.auto.conf"), conf); err != nil {
		s.Close()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(s.dataDir, "standby.signal"), nil, 0o600); err != nil {
		s.Close()
		return nil, fmt.Errorf("writing standby.signal: %w", err)
	}
	if err := chownTree(s.user, s.root); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.startOnFreePort(ctx, "postgresql.auto.conf"); err != nil {
		s.Close()
		return nil, err
	}
	if err := waitStreaming(ctx, conn, name); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w\nstandby log tail:\n%s", err, s.logTail(4096))
	}
	return s, nil
}

// StandbyForTest is StartStandby, closed with the test.
func (p *Postgres) StandbyForTest(t interface {
	Helper()
	Fatalf(string, ...any)
	Cleanup(func())
	Failed() bool
	Logf(string, ...any)
}, name string) *Postgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := p.StartStandby(ctx, name)
	if err != nil {
		t.Fatalf("starting standby: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("standby log tail (%s):\n%s", s.LogFile(), s.logTail(8<<10))
		}
		s.Close()
	})
	return s
}

// baseBackup copies the running server's data directory to dst between
// pg_backup_start and pg_backup_stop, on one session as they require.
func (p *Postgres) baseBackup(ctx context.Context, conn *pgx.Conn, dst string) error {
	if _, err := conn.Exec(ctx, `SELECT pg_backup_start('outboxd standby', true)`); err != nil {
		return fmt.Errorf("pg_backup_start: %w", err)
	}
	copyErr := copyDataDir(p.dataDir, dst)
	var label string
	if err := conn.QueryRow(ctx, `SELECT labelfile FROM pg_backup_stop(false)`).Scan(&label); err != nil {
		return fmt.Errorf("pg_backup_stop: %w", err)
	}
	if copyErr != nil {
		return copyErr
	}
	if err := os.WriteFile(filepath.Join(dst, "backup_label"), []byte(label), 0o600); err != nil {
		return fmt.Errorf("writing backup_label: %w", err)
	}
	return nil
}

// skipFiles and skipContents follow pg_basebackup (basebackup.c's exclude
// lists): files never copied, and directories copied empty.
var (
	skipFiles = map[string]bool{
		"postmaster.pid": true, "postmaster.opts": true, "backup_label": true, "tablespace_map": true,
		"backup_manifest": true, "standby.signal": true, "recovery.signal": true, "pg_internal.init": true,
		"postgres.log": true, // the harness's server log
	}
	skipContents = map[string]bool{
		"pg_wal": true, "pg_replslot": true, "pg_dynshmem": true, "pg_notify": true, "pg_serial": true,
		"pg_snapshots": true, "pg_stat_tmp": true, "pg_subtrans": true,
	}
)

func copyDataDir(src, dst string) error {
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) { // removed while we copy: the WAL replay covers it
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			if err := os.MkdirAll(target, 0o700); err != nil {
				return err
			}
			if skipContents[rel] {
				if rel == "pg_wal" {
					return os.MkdirAll(filepath.Join(target, "archive_status"), 0o700)
				}
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), "pgsql_tmp") {
				return filepath.SkipDir
			}
			return nil
		}
		if skipFiles[d.Name()] || strings.HasPrefix(d.Name(), "pgsql_tmp") || !d.Type().IsRegular() {
			return nil
		}
		return copyFile(path, target)
	})
	if err != nil {
		return fmt.Errorf("copying the data directory: %w", err)
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func chownTree(u pgUser, root string) error {
	if u.cred == nil {
		return nil
	}
	return filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, u.uid, u.gid)
	})
}

// waitStreaming polls the primary until walsender application name streams.
func waitStreaming(ctx context.Context, conn *pgx.Conn, name string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, name).Scan(&n)
		if err == nil && n == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("standby %q did not start streaming: %w", name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Promote ends recovery on a standby (pg_ctl promote) and returns once it
// accepts writes.
func (p *Postgres) Promote(ctx context.Context) error {
	if p.External() {
		return p.errExternal("promote")
	}
	if p.ctr != nil {
		return p.dockerPromote(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := p.user.command(ctx, p.root, pgBinary("pg_ctl"), "promote", "-w", "-t", "60", "-D", p.dataDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// Kill stops the server with pg_ctl stop -m immediate (a crash, as a failed
// primary) and leaves it stopped.
func (p *Postgres) Kill(ctx context.Context) error {
	if p.External() {
		return p.errExternal("kill")
	}
	if p.ctr != nil {
		return p.dockerKill(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stop(ctx, "immediate")
}

// ServerVersionNum is server_version_num, e.g. 170004.
func ServerVersionNum(ctx context.Context, conn *pgx.Conn) (int, error) {
	var v string
	if err := conn.QueryRow(ctx, `SHOW server_version_num`).Scan(&v); err != nil {
		return 0, fmt.Errorf("server_version_num: %w", err)
	}
	return strconv.Atoi(v)
}

// ColdCopy copies the stopped server's whole data directory (WAL and slots
// included) to dst, as a file-system backup taken with the server down is.
// RestoreColdCopy puts such a copy back in place of the data directory.
// Both need a harness-started local server that is stopped.
func (p *Postgres) ColdCopy(ctx context.Context, dst string) error {
	if err := p.canCopyCold(ctx); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", p.dataDir+"/.", dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cold copy: %w\n%s", err, out)
	}
	return nil
}

// RestoreColdCopy replaces the stopped server's data directory with the
// copy ColdCopy made in src (which stays, for another restore).
func (p *Postgres) RestoreColdCopy(ctx context.Context, src string) error {
	if err := p.canCopyCold(ctx); err != nil {
		return err
	}
	if err := os.RemoveAll(p.dataDir); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", src, p.dataDir).CombinedOutput(); err != nil {
		return fmt.Errorf("restoring the cold copy: %w\n%s", err, out)
	}
	return nil
}

func (p *Postgres) canCopyCold(ctx context.Context) error {
	switch {
	case p.External():
		return p.errExternal("copy the data directory of")
	case p.ctr != nil:
		return errors.New("harness: a cold copy of a container's data directory is not supported")
	case p.isRunning(ctx):
		return errors.New("harness: a cold copy needs the server stopped")
	}
	return nil
}
