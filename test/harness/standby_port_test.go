package harness

import (
	"testing"
	"time"
)

// TestStandbyPortTaken: a standby whose port another process holds fails
// to start with what pgBindFailed knows, so StartStandby tries a new port
// (onFreePort); on the process backend startOnFreePort, what StartStandby
// starts it with, then starts it on a new port, streaming again.
func TestStandbyPortTaken(t *testing.T) {
	ctx := testCtx(t, 4*time.Minute)
	pg := PostgresForTest(t)
	if pg.External() {
		t.Skip("needs a harness-started server")
	}
	s := pg.StandbyForTest(t, "standby1")
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	held := s.port
	holdPort(t, held, false)
	err := s.Start(ctx)
	if log := s.logTail(8 << 10); err == nil || !pgBindFailed(log) {
		t.Fatalf("start on a taken port: %v; want the bind failure pgBindFailed knows; log tail:\n%s", err, log)
	}
	if s.ctr != nil {
		return // a container's port is fixed: StartStandby runs another container
	}
	if err := s.startOnFreePort(ctx, "postgresql.auto.conf"); err != nil {
		t.Fatal(err)
	}
	if s.port == held {
		t.Fatalf("restarted on the taken port %d", held)
	}
	conn := mustConnect(ctx, t, pg, "postgres")
	if err := waitStreaming(ctx, conn, "standby1"); err != nil {
		t.Fatal(err)
	}
}
