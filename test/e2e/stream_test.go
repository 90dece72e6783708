package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ALTER TABLE mid-stream: pgoutput re-announces the relation and rows decode
// with the new column layout.
func TestSchemaChangeMidStream(t *testing.T) {
	f := newFixture(t)
	f.startRelay()
	f.commit(event{1, "a", "E", `{"v": 1}`})
	f.exec(`ALTER TABLE outbox ADD COLUMN tenant text DEFAULT 'acme'`)
	f.exec(`ALTER TABLE outbox DROP COLUMN created_at`)
	f.commit(event{2, "a", "E", `{"v": 2}`})
	// Columns in a different physical order than before.
	f.exec(`ALTER TABLE outbox RENAME COLUMN payload TO payload_old`)
	f.exec(`ALTER TABLE outbox ALTER COLUMN payload_old DROP NOT NULL`)
	f.exec(`ALTER TABLE outbox ADD COLUMN payload jsonb`)
	end := f.commit(event{3, "a", "E", `{"v": 3}`})
	f.waitConfirmed(end, 20*time.Second)
	recs := f.records()
	first, _ := byID(t, recs)
	for i := 1; i <= 3; i++ {
		r, ok := first[eventID(i)]
		if !ok {
			t.Fatalf("event %d missing", i)
		}
		if want := fmt.Sprintf(`{"v": %d}`, i); string(r.Value) != want {
			t.Errorf("event %d value %q, want %q", i, r.Value, want)
		}
	}
}

// A transaction far larger than the in-flight bound is relayed with bounded
// memory: rows are produced as they arrive, and reading pauses while Kafka
// catches up. 200k rows x ~300 bytes = 60 MB of events; outboxd's peak RSS
// must stay well below what buffering the transaction would take.
func TestLargeTransactionBoundedMemory(t *testing.T) {
	f := newFixture(t)
	r := f.startRelay("--max-inflight-events", "5000", "--max-inflight-bytes", "4MiB")
	// The process's own footprint (binary, runtime, clients) before the
	// transaction: what the bound is measured from, so that a larger binary
	// is not taken for a buffered transaction.
	base := peakRSS(t, r.Pid())
	const rows = 200000
	f.exec(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT ('00000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid, $1, 'k' || (g % 100), 'Bulk',
		       jsonb_build_object('n', g, 'pad', repeat('p', 250))
		FROM generate_series(1, $2) g`, f.agg, rows)
	end := f.walLSN()
	f.waitConfirmed(end, 120*time.Second)
	if n := f.topicCount(f.topic()); n != rows {
		t.Fatalf("topic holds %d records, want %d", n, rows)
	}
	hwm := peakRSS(t, r.Pid())
	t.Logf("peak RSS %d MiB (%d MiB before the transaction) for a %d-row (~%d MiB) transaction", hwm>>20, base>>20, rows, rows*300>>20)
	// Buffering the transaction would add its ~57 MiB to the footprint; the
	// in-flight bounds (4 MiB, 5,000 events) and the garbage collector's
	// headroom add 23-37 MiB as measured on 2 cores (GC timing varies it).
	if hwm-base > 48<<20 {
		t.Fatalf("peak RSS grew by %d MiB (%d → %d MiB) > 48 MiB: the transaction was buffered", (hwm-base)>>20, base>>20, hwm>>20)
	}
}

// peakRSS reads VmHWM of a live process.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}
