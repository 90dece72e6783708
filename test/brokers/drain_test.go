package brokers

import (
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

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/sink/rabbitmq"
	"github.com/outboxd/outboxd/test/harness"
)

// -long runs what takes minutes: TestDrainMemory (a 200,000-event drain
// per broker) and TestNetworkFaults' 20 s black hole (3 s past not-ready
// without it). `go test ./test/brokers/ -args -long`.
var long = flag.Bool("long", false, "run the slow tests: large drains, a 20 s black hole")

// drainEvents is the size of TestDrainMemory's backlog.
var drainEvents = flag.Int("drain-events", 200_000, "events in TestDrainMemory's backlog")

// drainStats is what drain measured.
type drainStats struct {
	events                     int
	took                       time.Duration
	peakRSS                    int64   // outboxd's VmHWM
	inflightEvents, inflightMB float64 // the highest outboxd_inflight_* sampled
	heapMB, goalMB, sysMB      float64 // the highest go_memstats_* sampled
}

func (d drainStats) String() string {
	load, _ := os.ReadFile("/proc/loadavg")
	return fmt.Sprintf("%d events drained in %s (%.0f ev/s, startup included), outboxd peak RSS %.1f MiB; in flight at most %.0f events, %.1f MiB; Go heap in use at most %.1f MiB (GC goal %.1f MiB, from the OS %.1f MiB); load %s",
		d.events, d.took.Round(time.Millisecond), float64(d.events)/d.took.Seconds(), float64(d.peakRSS)/(1<<20),
		d.inflightEvents, d.inflightMB, d.heapMB, d.goalMB, d.sysMB, strings.Join(strings.Fields(string(load))[:3], " "))
}

// drain commits a backlog of events while no one reads the slot (1 event
// per transaction, ~210-byte payloads, 1,000 aggregates: make bench's
// drain case), then runs outboxd with extra until the slot is confirmed
// past it, sampling /metrics every 50 ms. With OUTBOXD_TEST_HEAP=dir it
// saves outboxd's heap profile whenever the Go heap in use reached a new
// high (dir/heap-<name>.pb.gz).
func (f *fixture) drain(name string, events int, extra ...string) drainStats {
	f.t.Helper()
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	f.exec(`DO $$ BEGIN
	FOR g IN 1..` + strconv.Itoa(events) + ` LOOP
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
	r := f.startRelay(append([]string{"--pprof"}, extra...)...)
	d := drainStats{events: events}
	heapDir, heapAt := os.Getenv("OUTBOXD_TEST_HEAP"), 0.0
	for f.slotState().ConfirmedFlushLSN < end {
		if time.Since(start) > 5*time.Minute {
			f.t.Fatalf("the backlog of %d events did not drain in 5 minutes", events)
		}
		m, err := harness.Metrics(f.ctx, r.http)
		if err != nil {
			f.t.Fatal(err)
		}
		d.inflightEvents = max(d.inflightEvents, m["outboxd_inflight_events"])
		d.inflightMB = max(d.inflightMB, m["outboxd_inflight_bytes"]/(1<<20))
		d.heapMB = max(d.heapMB, m["go_memstats_heap_inuse_bytes"]/(1<<20))
		d.goalMB = max(d.goalMB, m["go_memstats_next_gc_bytes"]/(1<<20))
		d.sysMB = max(d.sysMB, m["go_memstats_sys_bytes"]/(1<<20))
		if heapDir != "" && m["go_memstats_heap_inuse_bytes"] > heapAt*1.05 {
			heapAt = m["go_memstats_heap_inuse_bytes"]
			if err := saveHeap(f.ctx, r.http, fmt.Sprintf("%s/heap-%s.pb.gz", heapDir, name)); err != nil {
				f.t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.took = time.Since(start)
	var err error
	if d.peakRSS, err = peakRSS(r.Pid()); err != nil {
		f.t.Fatal(err)
	}
	return d
}

// TestDrainMemory (-long) drains a 200,000-event backlog (-drain-events)
// through Kafka (kfake), then each broker, at outboxd's defaults, and
// checks that the in-flight bound holds: outboxd_inflight_events and
// outboxd_inflight_bytes, sampled from /metrics during the whole drain,
// never exceed the defaults (outboxd.DefaultMaxInflightEvents, 16 MiB and
// the one record that may cross it). It logs the drain rate and outboxd's
// peak RSS, the figures of docs/rabbitmq.md's Memory section. OUTBOXD_TEST_DRAIN_BROKERS=kafka,rabbitmq
// picks brokers, OUTBOXD_TEST_DRAIN_ARGS adds outboxd flags.
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
			maxEvents, maxMB := float64(outboxd.DefaultMaxInflightEvents), 17.0 // outboxd's defaults
			d := f.drain(k.name, *drainEvents, strings.Fields(os.Getenv("OUTBOXD_TEST_DRAIN_ARGS"))...)
			t.Logf("%s: %v", k.name, d)
			if os.Getenv("OUTBOXD_TEST_DRAIN_ARGS") == "" && (d.inflightEvents > maxEvents || d.inflightMB > maxMB) {
				t.Fatalf("in flight: %.0f events, %.1f MiB; the bound is %.0f events, %.0f MiB", d.inflightEvents, d.inflightMB, maxEvents, maxMB)
			}
		})
	}
}

// With RabbitMQ, outboxd holds at most twice the confirm window in flight
// (4,096 events, the default bound) unless --max-inflight-events says
// otherwise: RabbitMQ confirms more slowly than outboxd reads, so a larger
// bound would all be in memory during a drain without draining faster.
// The bound is read from /metrics during a 20,000-event drain (main
// before the RabbitMQ bound: 11,053 in flight at once).
func TestRabbitMQInflightBound(t *testing.T) {
	f := newFixture(t, startRabbitMQ(t, false))
	d := f.drain("rabbitmq", 20_000)
	t.Logf("%v", d)
	if d.inflightEvents > 2*rabbitmq.DefaultWindow {
		t.Fatalf("%.0f events in flight; RabbitMQ's default bound is %d", d.inflightEvents, 2*rabbitmq.DefaultWindow)
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
