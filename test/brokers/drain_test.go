package brokers

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// -long runs the tests that take minutes (a 200,000-event drain per
// broker); `go test ./test/brokers/` leaves them out.
var long = flag.Bool("long", false, "run the slow tests (large drains)")

// drainEvents is the size of TestDrainMemory's backlog.
var drainEvents = flag.Int("drain-events", 200_000, "events in TestDrainMemory's backlog")

// TestDrainMemory drains a backlog through each broker at the defaults
// and checks that the in-flight bound holds: outboxd_inflight_events and
// outboxd_inflight_bytes, sampled from /metrics during the whole drain,
// never exceed --max-inflight-events and --max-inflight-bytes (plus one
// event: the bound is checked before an event is handed over), and the
// sink's own queue (outboxd_sink_buffered_events, where the sink reports
// one) never holds more than it is allowed to. It logs the drain rate and
// outboxd's peak RSS (VmHWM); with OUTBOXD_TEST_HEAP=dir it saves a heap
// profile taken when the in-flight events peak.
func TestDrainMemory(t *testing.T) {
	if !*long {
		t.Skip("a 200,000-event drain per broker: run with -long")
	}
	drainKinds := append([]brokerKind{{name: "kafka", start: startKfake}}, kinds...)
	if only := os.Getenv("OUTBOXD_TEST_DRAIN_BROKERS"); only != "" {
		var sel []brokerKind
		for _, k := range drainKinds {
			if strings.Contains(","+only+",", ","+k.name+",") {
				sel = append(sel, k)
			}
		}
		drainKinds = sel
	}
	for _, k := range drainKinds {
		t.Run(k.name, func(t *testing.T) {
			f := newFixture(t, k.start(t, false))
			const maxEvents, maxBytes = 50_000, 32 << 20 // outboxd's defaults
			f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
			// 1 event per transaction, ~210-byte payloads, 1,000
			// aggregates: make bench's drain case.
			f.exec(`DO $$ BEGIN
	FOR g IN 1..` + strconv.Itoa(*drainEvents) + ` LOOP
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES (lpad(to_hex(g), 32, '0')::uuid, '` + f.agg + `', 'agg-' || (g % 1000), 'OrderCreated',
			jsonb_build_object('seq', g, 'orderId', 'order-' || g, 'customerId', 'cust-' || (g % 997),
				'status', 'CREATED', 'currency', 'EUR', 'items', g % 7 + 1, 'total', round((g % 100000) / 100.0, 2),
				'note', md5(g::text) || md5(g::text || ':')));
		COMMIT;
	END LOOP;
END $$`)
			end := f.walLSN()
			start := time.Now()
			r := f.startRelay("--pprof")
			var peakEvents, peakBytes, peakBuffered float64
			heapDir := os.Getenv("OUTBOXD_TEST_HEAP")
			heapAt := 0.0
			for f.slotState().ConfirmedFlushLSN < end {
				if time.Since(start) > 5*time.Minute {
					t.Fatalf("the backlog did not drain in 5 minutes")
				}
				m, err := metricValues(f.ctx, r.http, "outboxd_inflight_events", "outboxd_inflight_bytes", "outboxd_sink_buffered_events")
				if err != nil {
					t.Fatal(err)
				}
				peakEvents = max(peakEvents, m["outboxd_inflight_events"])
				peakBytes = max(peakBytes, m["outboxd_inflight_bytes"])
				peakBuffered = max(peakBuffered, m["outboxd_sink_buffered_events"])
				if heapDir != "" && m["outboxd_inflight_events"] > heapAt*1.1 {
					heapAt = m["outboxd_inflight_events"]
					if err := saveHeap(f.ctx, r.http, fmt.Sprintf("%s/heap-%s.pb.gz", heapDir, k.name)); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			took := time.Since(start)
			rss, err := peakRSS(r.Pid())
			if err != nil {
				t.Fatal(err)
			}
			load, _ := os.ReadFile("/proc/loadavg")
			t.Logf("%s: %d events drained in %s (%.0f ev/s, startup included), outboxd peak RSS %.1f MiB; in flight at most %.0f events, %.1f MiB; sink buffer at most %.0f events; load %s",
				k.name, *drainEvents, took.Round(time.Millisecond), float64(*drainEvents)/took.Seconds(), float64(rss)/(1<<20), peakEvents, peakBytes/(1<<20), peakBuffered, strings.TrimSpace(string(load)))
			if peakEvents > maxEvents+1 || peakBytes > maxBytes+4096 {
				t.Fatalf("in flight: %.0f events, %.0f bytes; the bound is %d events, %d bytes", peakEvents, peakBytes, maxEvents, maxBytes)
			}
		})
	}
}

// kfakeBroker is a kfake process: only its flags (TestDrainMemory's
// Kafka column, to compare with).
type kfakeBroker struct {
	broker
	k *harness.Kafka
}

func startKfake(t *testing.T, _ bool) broker {
	k := harness.KafkaForTest(t)
	return &kfakeBroker{k: k}
}

func (b *kfakeBroker) flags() []string {
	return []string{"--kafka-brokers", strings.Join(b.k.Brokers(), ",")}
}

// metricValue reads one unlabelled series from outboxd's /metrics.
func metricValues(ctx context.Context, addr string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, n := range names {
			if rest, ok := strings.CutPrefix(line, n+" "); ok {
				v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
				if err == nil {
					out[n] = v
				}
			}
		}
	}
	return out, sc.Err()
}

// peakRSS is a process's VmHWM in bytes.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// saveHeap writes outboxd's heap profile (--pprof) to path.
func saveHeap(ctx context.Context, addr, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/heap", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	_, err = io.Copy(out, resp.Body)
	return err
}
