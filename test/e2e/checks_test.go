package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// expectExit runs outboxd to completion and checks its exit code and that its
// output names the problem and the fix.
func (f *fixture) expectExit(t *testing.T, code int, wants []string, extra ...string) {
	t.Helper()
	p, _ := f.spawn(extra...)
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	got, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("outboxd did not exit: %v\n%s", err, p.Log())
	}
	if got != code {
		t.Fatalf("exit code %d, want %d\n%s", got, code, p.Log())
	}
	for _, w := range wants {
		if !strings.Contains(p.Log(), w) {
			t.Errorf("output lacks %q:\n%s", w, p.Log())
		}
	}
}

func TestStartupCheckWALLevel(t *testing.T) {
	if sharedPG.External() {
		t.Skip("needs a throwaway cluster with wal_level=replica")
	}
	pg := harness.PostgresForTest(t, harness.WithConf("wal_level", "replica"))
	f := &fixture{t: t, ctx: context.Background(), pg: pg, kafka: sharedKafka, slot: "s_wal", logs: t.TempDir()}
	f.dsn = pg.DSN("postgres")
	f.expectExit(t, 1, []string{`wal_level is "replica"`, "ALTER SYSTEM SET wal_level = logical;"})
}

func TestStartupCheckReplicationPrivilege(t *testing.T) {
	f := newFixture(t)
	f.exec(`DROP ROLE IF EXISTS no_repl`)
	f.exec(`CREATE ROLE no_repl LOGIN`)
	f.dsn = strings.Replace(f.dsn, "postgres://postgres@", "postgres://no_repl@", 1)
	if !strings.Contains(f.dsn, "no_repl") {
		t.Fatalf("could not rewrite user in DSN %q", f.dsn)
	}
	f.expectExit(t, 1, []string{`role "no_repl" may not open a replication connection`, `ALTER ROLE "no_repl" WITH REPLICATION;`})
}

func TestStartupCheckPublication(t *testing.T) {
	f := newFixture(t)
	f.expectExit(t, 1, []string{`publication "missing" does not exist`, `CREATE PUBLICATION "missing" FOR TABLE public.outbox WITH (publish = 'insert');`},
		"--publication", "missing")
	f.exec(`CREATE PUBLICATION empty_pub`)
	f.expectExit(t, 1, []string{`publication "empty_pub" publishes no table`, `ALTER PUBLICATION "empty_pub" ADD TABLE`},
		"--publication", "empty_pub")
}

func TestStartupCheckSlotPlugin(t *testing.T) {
	f := newFixture(t)
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, f.slot)
	f.expectExit(t, 1, []string{fmt.Sprintf(`replication slot %q uses plugin "test_decoding"; outboxd needs pgoutput`, f.slot),
		fmt.Sprintf(`SELECT pg_drop_replication_slot('%s');`, f.slot)})
}

// A slot held by another process: outboxd says who holds it, keeps retrying
// instead of crash-looping, and streams as soon as it is released.
func TestSlotHeldByAnotherProcess(t *testing.T) {
	f := newFixture(t)
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	pid, release := f.holdSlot()
	p, r := f.spawn()
	want := fmt.Sprintf("is active for PID %d (intruder from", pid)
	if err := p.WaitLog(f.ctx, want); err != nil {
		t.Fatalf("no busy message %q: %v\n%s", want, err, p.Log())
	}
	if err := p.WaitLog(f.ctx, fmt.Sprintf("SELECT pg_terminate_backend(%d);", pid)); err != nil {
		t.Fatal(err)
	}
	release()
	if err := r.waitStreaming(f.ctx); err != nil {
		t.Fatalf("did not stream after the slot was released: %v\n%s", err, p.Log())
	}
	end := f.commit(event{1, "a", "E", `{}`})
	f.waitConfirmed(end, 20*time.Second)
}

// A frozen outboxd (no replies, connection still open, like one behind a
// dead network path) holds the slot: a new outboxd takes it over once the
// holder has been silent for --replication-timeout, instead of waiting for
// the server's wal_sender_timeout.
func TestStaleOutboxdWalsenderTakenOver(t *testing.T) {
	f := newFixture(t)
	old := f.startRelay("--status-interval", "500ms", "--replication-timeout", "2s")
	if err := old.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer old.Signal(syscall.SIGCONT)
	pid := f.slotState().ActivePID
	start := time.Now()
	p, r := f.spawn("--status-interval", "500ms", "--replication-timeout", "2s")
	if err := r.waitStreaming(f.ctx); err != nil {
		t.Fatalf("did not take the slot over: %v\n%s", err, p.Log())
	}
	if s := f.slotState(); s.ActivePID == pid {
		t.Fatal("the frozen walsender still holds the slot")
	}
	t.Logf("took over after %s", time.Since(start).Round(100*time.Millisecond))
	end := f.commit(event{1, "a", "E", `{}`})
	f.waitConfirmed(end, 20*time.Second)
}
