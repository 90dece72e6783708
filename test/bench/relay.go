package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// RelayRun is one outboxd drain: from process start until Kafka holds every
// event and the slot confirmed the end LSN.
type RelayRun struct {
	ExactlyOnce bool          // outboxd ran with --exactly-once
	Elapsed     time.Duration // max(KafkaAt, ConfirmedAt)
	KafkaAt     time.Duration // at-least-once: the topic's end offsets reached the event count; exactly-once: a read_committed consumer counted every event
	ConfirmedAt time.Duration // confirmed_flush_lsn reached the end LSN
	Delivered   int64         // records in the topic at the end
	OutboxdCPU  time.Duration // utime+stime of outboxd over its whole life
	PeakRSS     int64         // outboxd's VmHWM, bytes
	// Allocs is the heap objects outboxd allocated over its life to the
	// end of the drain (go_memstats_mallocs_total; startup included, -1:
	// unknown), CtxSwitches its threads' voluntary and involuntary context
	// switches over the same span: how often it slept and was woken or
	// preempted, which decides much of its CPU per event.
	Allocs      int64
	CtxSwitches int64
	CPU         CPUSplit
	// WalsenderLife is how long the walsender serving the slot ran, from
	// its start to the end of the drain: CPU.Walsender over it is its busy
	// share (walsender.go).
	WalsenderLife time.Duration
	Args          []string // outboxd's arguments beyond the bench's own (the run's mode)
}

// outboxd is a running relay.
type outboxd struct {
	*harness.Proc
	httpAddr string // /metrics, /status
	perf     []*exec.Cmd
}

// eosArgs are the arguments of outboxd's exactly-once mode (the checkpoint
// topic is the default one; each slot has its own key and transactional id).
var eosArgs = []string{"--exactly-once"}

// startOutboxd runs outboxd on w's database and slot with mode's arguments
// (eosArgs or none) and then the bench's extra arguments appended.
func (e *Env) startOutboxd(ctx context.Context, w *world, slot, name string, mode ...string) (*outboxd, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	args := []string{"run", "--postgres", w.dsn, "--slot", slot, "--publication", "outboxd", "--http-addr", addr}
	if e.mq != nil {
		args = append(args, e.mq.outboxdArgs(w)...)
	} else {
		args = append(args, "--kafka-brokers", strings.Join(e.Kafka.Brokers(), ","))
	}
	args = append(args, mode...)
	args = append(args, e.cfg.OutboxdArgs...)
	p, err := harness.StartProc(ctx, "outboxd-"+name, e.bin, args, e.cfg.OutboxdEnv, e.logDir)
	if err != nil {
		return nil, err
	}
	return &outboxd{Proc: p, httpAddr: addr}, nil
}

// stop sends SIGTERM, waits for a clean exit (bounded) and kills otherwise.
func (o *outboxd) stop() error {
	o.stopPerf()
	if o.Exited() {
		return nil
	}
	return o.Stop(30 * time.Second)
}

// perfRecord attaches `perf record -g` to pid (a no-op without -perf-dir);
// OUTBOXD_BENCH_PERF_EVENTS records those events instead of CPU samples.
func (e *Env) perfRecord(o *outboxd, pid int, name string) {
	if e.cfg.PerfDir == "" || pid <= 0 {
		return
	}
	_ = os.MkdirAll(e.cfg.PerfDir, 0o755)
	out := filepath.Join(e.cfg.PerfDir, name+".perf.data")
	args := []string{"record", "-q", "-F", "999", "-g"}
	if extra := os.Getenv("OUTBOXD_BENCH_PERF_EVENTS"); extra != "" {
		// e.g. sched:sched_switch: where each thread blocks, not where CPU goes
		args = []string{"record", "-q", "-g", "-e", extra}
	}
	cmd := exec.Command("perf", append(args, "-p", fmt.Sprint(pid), "-o", out)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.progress("perf record %s: %v", name, err)
		return
	}
	o.perf = append(o.perf, cmd)
}

func (o *outboxd) stopPerf() {
	for _, c := range o.perf {
		_ = c.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	o.perf = nil
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// drainOutboxd starts outboxd on a slot that holds want events ending at
// endLSN and measures until both Kafka and the slot have everything. With
// eos, outboxd runs with --exactly-once and "Kafka has it" means a
// read_committed consumer, reading the topic from where it ended before the
// run, has received every event: the end offsets would count transaction
// markers, and records of open transactions are not visible yet.
func (e *Env) drainOutboxd(ctx context.Context, w *world, slot string, want int64, endLSN uint64, timeout time.Duration, eos bool, extra ...string) (RelayRun, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r := RelayRun{ExactlyOnce: eos, Args: extra}
	var mode []string
	if e.mq != nil {
		if err := e.mq.reset(ctx, w); err != nil {
			return r, err
		}
	}
	// Earlier runs on the same backlog left their records in the topic.
	base, err := w.topicCount(ctx)
	if err != nil {
		return r, err
	}
	var cc *committedCounter
	if eos {
		mode = eosArgs
		if cc, err = e.countCommitted(ctx, w.topic); err != nil {
			return r, err
		}
		defer cc.close()
	}
	delivered := func(ctx context.Context) (int64, error) {
		if cc != nil {
			return cc.n.Load(), nil
		}
		n, err := w.topicCount(ctx)
		return n - base, err
	}
	snap := e.snapshot()
	start := time.Now()
	o, err := e.startOutboxd(ctx, w, slot, slot, append(mode, extra...)...)
	if err != nil {
		return r, err
	}
	defer o.stop()
	e.perfRecord(o, o.Pid(), "outboxd-"+slot)
	walsender := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if o.Exited() {
			code, _ := o.Wait(ctx)
			return r, fmt.Errorf("outboxd exited (code %d) during the drain; log tail:\n%s", code, tailOf(o.Log(), 3000))
		}
		if r.KafkaAt == 0 {
			n, err := delivered(ctx)
			if err == nil && n >= want {
				r.KafkaAt = time.Since(start)
			}
		}
		if r.ConfirmedAt == 0 || walsender == 0 {
			confirmed, pid, err := w.slotConfirmed(ctx, slot)
			if err == nil && pid > 0 && walsender == 0 {
				walsender = pid
				e.perfRecord(o, pid, "walsender-"+slot)
			}
			if err == nil && r.ConfirmedAt == 0 && confirmed >= endLSN {
				r.ConfirmedAt = time.Since(start)
			}
		}
		if r.KafkaAt > 0 && r.ConfirmedAt > 0 {
			break
		}
		select {
		case <-ctx.Done():
			n, _ := delivered(context.Background())
			return r, fmt.Errorf("outboxd drain of %d events: %d in Kafka, kafka done=%v confirmed=%v: %w; log tail:\n%s",
				want, n, r.KafkaAt > 0, r.ConfirmedAt > 0, ctx.Err(), tailOf(o.Log(), 3000))
		case <-tick.C:
		}
	}
	r.Elapsed = max(r.KafkaAt, r.ConfirmedAt)
	r.OutboxdCPU = cpuOf(o.Pid())
	r.PeakRSS = peakRSS(o.Pid())
	r.CtxSwitches = ctxSwitches(o.Pid())
	r.Allocs = o.mallocs(ctx)
	r.CPU = e.split(snap, walsender)
	r.WalsenderLife = procLife(walsender)
	r.CPU.Outboxd = r.OutboxdCPU
	// Count after stopping: nothing may arrive beyond want (no duplicates
	// without faults).
	if err := o.stop(); err != nil {
		return r, err
	}
	var n int64
	if cc != nil {
		n, err = cc.settle(ctx, want)
	} else {
		n, err = delivered(ctx)
	}
	if err != nil {
		return r, err
	}
	r.Delivered = n
	if n != want {
		return r, fmt.Errorf("outboxd delivered %d records, want exactly %d", n, want)
	}
	return r, nil
}

// committedCounter counts the records a read_committed consumer receives
// from one topic: aborted records and transaction markers never show, and
// records of an open transaction only once it commits.
type committedCounter struct {
	cl   *kgo.Client
	n    atomic.Int64
	done chan struct{}
}

// countCommitted starts counting the records written to topic from now on:
// it starts at the partitions' current end offsets (no transaction is open
// between runs, so those are where the next run's records begin).
func (e *Env) countCommitted(ctx context.Context, topic string) (*committedCounter, error) {
	ends, err := e.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	from := map[int32]kgo.Offset{}
	var errs []error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			errs = append(errs, o.Err)
			return
		}
		from[o.Partition] = kgo.NewOffset().At(o.Offset)
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	opts, err := e.Kafka.ClientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(200*time.Millisecond))...)
	if err != nil {
		return nil, err
	}
	c := &committedCounter{cl: cl, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			f := cl.PollFetches(context.Background())
			if f.IsClientClosed() {
				return
			}
			c.n.Add(int64(f.NumRecords()))
		}
	}()
	return c, nil
}

// settle waits until the count has not moved for a second (after outboxd
// stopped: anything committed is visible by then) and returns it; more
// than want returns at once.
func (c *committedCounter) settle(ctx context.Context, want int64) (int64, error) {
	last, since := c.n.Load(), time.Now()
	for time.Since(since) < time.Second {
		select {
		case <-ctx.Done():
			return c.n.Load(), ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		n := c.n.Load()
		if n > want {
			return n, nil
		}
		if n != last {
			last, since = n, time.Now()
		}
	}
	return last, nil
}

func (c *committedCounter) close() {
	c.cl.Close()
	<-c.done
}

// scrapeMetrics returns outboxd's /metrics page.
func scrapeMetrics(ctx context.Context, addr string) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// metricValue is the value of the unlabelled sample name on a /metrics
// page (false: the page has none).
func metricValue(page, name string) (float64, bool) {
	for _, line := range strings.Split(page, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// mallocs is how many heap objects outboxd has allocated over its life
// (go_memstats_mallocs_total; -1: unknown).
func (o *outboxd) mallocs(ctx context.Context) int64 {
	page, err := scrapeMetrics(ctx, o.httpAddr)
	if err != nil {
		return -1
	}
	v, ok := metricValue(page, "go_memstats_mallocs_total")
	if !ok {
		return -1
	}
	return int64(v)
}
