package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// An idle outbox must not pin WAL: while another table of the same database
// and another database write ~50 MB, confirmed_flush_lsn keeps up with the
// server's WAL position (no heartbeat table needed).
func TestIdleOutboxDoesNotPinWAL(t *testing.T) {
	f := newFixture(t)
	f.startRelay()
	f.commit(event{1, "a", "E", `{}`})

	f.exec(`CREATE TABLE busy (id bigserial PRIMARY KEY, filler text)`)
	otherDSN, err := f.pg.NewDatabase(f.ctx, f.db+"_other")
	if err != nil {
		t.Fatal(err)
	}
	_ = otherDSN
	other, err := f.pg.Connect(f.ctx, f.db+"_other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	if _, err := other.Exec(f.ctx, `CREATE TABLE busy (id bigserial PRIMARY KEY, filler text)`); err != nil {
		t.Fatal(err)
	}
	start := f.walLSN()
	// 25 MB into each: 5 x 5,000 rows of 1 kB per database.
	for i := 0; i < 5; i++ {
		f.exec(`INSERT INTO busy (filler) SELECT repeat('x', 1000) FROM generate_series(1, 5000)`)
		if _, err := other.Exec(f.ctx, `INSERT INTO busy (filler) SELECT repeat('y', 1000) FROM generate_series(1, 5000)`); err != nil {
			t.Fatal(err)
		}
	}
	end := f.walLSN()
	if end-start < 50<<20 {
		t.Fatalf("wrote only %d bytes of WAL", end-start)
	}
	f.waitConfirmed(end, 30*time.Second)
	s := f.slotState()
	t.Logf("wrote %d MB of WAL; slot confirmed %s, WAL at %s", (end-start)>>20, harness.FormatLSN(s.ConfirmedFlushLSN), harness.FormatLSN(end))
	// The outbox event is still there exactly once.
	if n := f.topicCount(f.topic()); n != 1 {
		t.Fatalf("topic holds %d records, want 1", n)
	}
}
