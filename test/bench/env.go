// Package bench measures outboxd against what bounds it and what it
// replaces, on one throwaway PostgreSQL server, in one run, once per broker
// kind (kfake, one Apache Kafka node, a 3-node Apache cluster; with -brokers
// also NATS JetStream and RabbitMQ, mq.go): backlog drain
// throughput beside a read-only pgoutput reader (the walsender's ceiling) and
// a polling publisher, commit-to-consumer latency at fixed write rates, CPU
// (broker processes included) and memory use, and the cost of exactly-once
// mode (drain throughput and latency beside at-least-once). `make bench` runs
// it through test/cmd/bench; bench_test.go runs one small case so the code
// keeps working.
package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// Config selects what a run measures and how much.
type Config struct {
	DrainEvents     int             // events per drain case (100k; -quick 10k)
	Reps            int             // ceiling and outboxd runs per drain case; the fastest counts
	TxnSizes        []int           // events per transaction of the drain cases
	LatencyRates    []int           // events/s of the latency runs
	EOSTxnSizes     []int           // events per transaction of the exactly-once drains
	EOSLatencyRate  int             // events/s of the exactly-once latency run
	LatencyDuration time.Duration   // how long writers write in each latency run
	PollIntervals   []time.Duration // polling publisher idle sleeps in the latency runs
	BigTxnRows      int             // rows of the single large transaction
	LargeEvents     int             // events of the large-payload drain
	LargePayload    int             // approximate payload bytes of the large-payload drain
	MemRows         int             // rows of the memory case's one transaction (memcurve.go)
	MemBounds       []int64         // its --max-inflight-bytes bounds (0: outboxd's defaults)
	OutboxdArgs     []string        // appended to outboxd's command line
	OutboxdEnv      []string        // added to outboxd's environment (KEY=VALUE), e.g. GOMAXPROCS=1
	Cases           map[string]bool // drain, latency, resources, eos, debezium
	Debezium        DebeziumConfig  // the debezium case (debezium.go)
	Sustained       SustainedConfig // the sustained case (sustained.go)
	Brokers         []string        // broker kinds, one column each, in order (harness kinds: kfake, apache, apache-cluster, external)
	SkipPolling     bool            // drain cases without the polling publisher
	PerfDir         string          // if set, `perf record` outboxd and its walsender during drains
	Hogs            int             // CPU hogs (stress-ng --cpu N) beside the whole run (hogs.go); 0: none
	HogsLimit       time.Duration   // how long the hogs may run at most (the run's -timeout)
	Progress        io.Writer       // progress lines (nil: discarded)
}

// DefaultConfig is `make bench`; quick is the smoke-test size.
func DefaultConfig(quick bool) Config {
	c := Config{
		DrainEvents:     100_000,
		Reps:            3,
		TxnSizes:        []int{1, 10, 100},
		LatencyRates:    []int{1000, 5000},
		EOSTxnSizes:     []int{10, 100},
		EOSLatencyRate:  1000,
		LatencyDuration: 12 * time.Second,
		PollIntervals:   []time.Duration{500 * time.Millisecond, 10 * time.Millisecond},
		BigTxnRows:      1_000_000,
		LargeEvents:     20_000,
		LargePayload:    4096,
		MemRows:         200_000,
		MemBounds:       []int64{0, 4 << 20, 8 << 20, 32 << 20}, // 32 MiB: the default before issue 34
		Cases:           map[string]bool{"drain": true, "latency": true, "resources": true, "eos": true, "debezium": true, "binary": true, "memory": true, "sched": true},
		Debezium:        defaultDebezium(quick),
		Sustained:       defaultSustained(quick),
		Brokers:         DefaultBrokers(),
	}
	if quick {
		c.DrainEvents = 10_000
		c.Reps = 1
		c.LatencyDuration = 5 * time.Second
		c.BigTxnRows = 100_000
		c.LargeEvents = 10_000
	}
	return c
}

// AllBrokers are the broker kinds `make bench` measures, one column each.
var AllBrokers = []string{harness.KindKfake, harness.KindApache, harness.KindApacheCluster}

// DefaultBrokers is every kind in AllBrokers, or only the one the
// environment names (OUTBOXD_TEST_KAFKA: external; OUTBOXD_TEST_KAFKA_KIND).
func DefaultBrokers() []string {
	if os.Getenv(harness.EnvKafka) != "" || os.Getenv(harness.EnvKafkaKind) != "" {
		if kind, err := harness.KafkaKind(); err == nil {
			return []string{kind}
		}
	}
	return append([]string(nil), AllBrokers...)
}

// Env is the servers and the binary every case shares: one PostgreSQL
// cluster for the whole run, one broker at a time (StartBroker).
type Env struct {
	cfg    Config
	PG     *harness.Postgres
	Kafka  *harness.Kafka
	bin    string
	logDir string
	kcl    *kgo.Client
	adm    *kadm.Client
	mq     msgBroker // a nats or rabbitmq column (mq.go); Kafka, kcl and adm are nil then

	postmasterPID int
	// brokerPIDs are the broker's processes (kfaked, or one JVM per Apache
	// node), read by the watch goroutine (checkServers) while the cases
	// start and stop brokers: only under pidsMu (setBrokerPIDs, brokerProcs).
	brokerPIDs []int
	pidsMu     sync.Mutex
	BrokerDesc string // what the broker is, for the table header
	Machine    Machine
	PGSettings string
	worlds     int   // worlds created so far
	Restarts   int   // servers found dead and restarted between cases
	hogs       *hogs // -hogs (hogs.go); nil without
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.state != 'Z'
}

// checkServers fails when the broker or PostgreSQL died: something outside
// the bench stopped them (other processes on a shared machine), or they
// crashed.
func (e *Env) checkServers() error {
	for _, pid := range e.brokerProcs() {
		if !alive(pid) {
			if e.mq != nil {
				return fmt.Errorf("%s (pid %d) exited during the case", e.mq.brokerIs(), pid)
			}
			return fmt.Errorf("%s broker (pid %d) exited during the case; log: %s", e.Kafka.Kind(), pid, e.Kafka.LogFile())
		}
	}
	if e.postmasterPID > 0 && !alive(e.postmasterPID) {
		return fmt.Errorf("postgres (pid %d) exited during the case", e.postmasterPID)
	}
	return nil
}

// ensureServers restarts a server that died since the last case.
func (e *Env) ensureServers(ctx context.Context) error {
	if e.checkServers() == nil {
		return nil
	}
	e.Restarts++
	e.progress("a server died (%v): restarting it", e.checkServers())
	if err := e.PG.Start(ctx); err != nil {
		return err
	}
	if e.mq != nil {
		if err := e.mq.restart(ctx); err != nil {
			return err
		}
	} else if err := e.Kafka.Start(ctx); err != nil {
		return err
	}
	e.postmasterPID = postmasterPID(e.PG.Dir())
	e.setBrokerPIDs(e.findBrokerPIDs())
	return e.checkServers()
}

// watch returns a context that is cancelled when a server dies, so that
// nothing waits on a dead broker until its timeout.
func (e *Env) watch(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := e.checkServers(); err != nil {
					cancel(err)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// benchConf keeps checkpoints out of the measurements: the run writes a few
// GB of WAL, and a checkpoint in the middle of one case would only add noise.
var benchConf = [][2]string{
	{"max_wal_size", "8GB"},
	{"checkpoint_timeout", "1h"},
}

// StartEnv builds outboxd and starts PostgreSQL; StartBroker starts a
// broker. Close it.
func StartEnv(ctx context.Context, cfg Config) (_ *Env, err error) {
	e := &Env{cfg: cfg, Machine: describeMachine()}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	e.progress("building outboxd")
	if e.bin, err = harness.BuildBinary(ctx, "./cmd/outboxd"); err != nil {
		return nil, err
	}
	if e.logDir, err = os.MkdirTemp("", "outboxd-bench-"); err != nil {
		return nil, err
	}
	if cfg.Hogs > 0 {
		e.progress("starting %d CPU hogs (stress-ng --cpu %d) for the whole run", cfg.Hogs, cfg.Hogs)
		if e.hogs, err = startHogs(ctx, cfg.Hogs, cmp.Or(cfg.HogsLimit, time.Hour), e.logDir); err != nil {
			return nil, err
		}
	}
	e.progress("starting PostgreSQL")
	var opts []harness.PGOption
	for _, kv := range benchConf {
		opts = append(opts, harness.WithConf(kv[0], kv[1]))
	}
	if e.PG, err = harness.StartPostgres(ctx, opts...); err != nil {
		return nil, err
	}
	e.postmasterPID = postmasterPID(e.PG.Dir())
	conn, err := e.PG.Connect(ctx, "postgres")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var settings []string
	rows, err := conn.Query(ctx, `SELECT name, setting, coalesce(unit, '') FROM pg_settings WHERE name IN
		('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', 'logical_decoding_work_mem', 'max_wal_size', 'wal_level')
		ORDER BY name`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var n, s, u string
		if err := rows.Scan(&n, &s, &u); err != nil {
			return nil, err
		}
		settings = append(settings, n+"="+s+u)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	e.PGSettings = strings.Join(settings, " ")
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&e.Machine.Postgres); err != nil {
		return nil, err
	}
	return e, nil
}

// StartBroker stops the running broker, if any, and starts one of kind
// (a harness kind). Only one runs at a time, so that an idle JVM does not
// share the CPU with another broker's measurements.
func (e *Env) StartBroker(ctx context.Context, kind string) (err error) {
	e.StopBroker()
	defer func() {
		if err != nil {
			e.StopBroker()
		}
	}()
	e.progress("starting broker: %s", kind)
	start := time.Now()
	if isMsgBroker(kind) {
		// No warm-up: neither server has a JIT that a first run would pay
		// for (BEAM's JIT compiles at load), nor a transaction log to create.
		if e.mq, err = startMsgBroker(ctx, kind); err != nil {
			return fmt.Errorf("starting %s: %w", kind, err)
		}
		e.setBrokerPIDs(e.mq.pids())
		e.BrokerDesc = e.mq.desc()
		e.progress("broker %s ready in %s: %s (pids %v)", kind, time.Since(start).Round(100*time.Millisecond), e.BrokerDesc, e.brokerProcs())
		return nil
	}
	if e.Kafka, err = harness.StartKafkaKind(ctx, kind); err != nil {
		return fmt.Errorf("starting %s: %w", kind, err)
	}
	copts, err := e.Kafka.ClientOpts()
	if err != nil {
		return err
	}
	if e.kcl, err = kgo.NewClient(copts...); err != nil {
		return err
	}
	e.adm = kadm.NewClient(e.kcl)
	e.setBrokerPIDs(e.findBrokerPIDs())
	e.BrokerDesc = e.describeBroker()
	e.progress("broker %s ready in %s: %s", kind, time.Since(start).Round(100*time.Millisecond), e.BrokerDesc)
	if err := e.warmBroker(ctx); err != nil {
		return fmt.Errorf("warming up %s: %w", kind, err)
	}
	return nil
}

// warmBroker does once what would otherwise land in the first measured
// run: a fresh JVM compiles its hot paths, and Apache Kafka creates its
// transaction state log on the first transactional producer. It produces
// warmupRecords records (acks=all, idempotent) and commits one transaction.
func (e *Env) warmBroker(ctx context.Context) error {
	const warmupRecords, topic = 20_000, "bench.warmup"
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := e.adm.CreateTopic(ctx, 3, -1, nil, topic); err != nil && !strings.Contains(err.Error(), "TOPIC_ALREADY_EXISTS") {
		return fmt.Errorf("creating %s: %w", topic, err)
	}
	opts, err := e.Kafka.ClientOpts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.TransactionalID(fmt.Sprintf("bench-warmup-%d", os.Getpid())))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	payload := make([]byte, 200)
	for i := 0; i < warmupRecords; i += 1000 {
		if err := cl.BeginTransaction(); err != nil {
			return err
		}
		recs := make([]*kgo.Record, 1000)
		for j := range recs {
			recs[j] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", j%100), Value: payload}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return err
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			return err
		}
	}
	e.progress("broker warmed up in %s (%d records in %d transactions)", time.Since(start).Round(100*time.Millisecond), warmupRecords, warmupRecords/1000)
	return nil
}

// StopBroker stops the broker StartBroker started and removes its data.
func (e *Env) StopBroker() {
	if e.kcl != nil {
		e.kcl.Close()
		e.kcl, e.adm = nil, nil
	}
	if e.Kafka != nil {
		e.Kafka.Close()
		e.Kafka = nil
	}
	if e.mq != nil {
		e.mq.close()
		e.mq = nil
	}
	e.setBrokerPIDs(nil)
	e.BrokerDesc = ""
}

// findBrokerPIDs returns the broker's processes: each Apache node's JVM,
// or kfaked (found by its data dir); none for an external cluster.
func (e *Env) findBrokerPIDs() []int {
	if e.mq != nil {
		return e.mq.pids()
	}
	var pids []int
	if a := e.Kafka.Apache(); a != nil {
		for _, nd := range a.Nodes() {
			if pid := nd.Pid(); pid > 0 {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	if lf := e.Kafka.LogFile(); lf != "" && !e.Kafka.External() {
		if pid := findProc("-data-dir " + filepath.Join(filepath.Dir(lf), "data")); pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// describeBroker says what the broker is: kind, version, nodes, the JVM's
// flags as it runs (from its command line) and the topics' replication.
func (e *Env) describeBroker() string {
	a := e.Kafka.Apache()
	switch {
	case e.Kafka.External():
		return "external cluster (" + harness.EnvKafka + "=" + strings.Join(e.Kafka.Brokers(), ",") + ")"
	case a == nil:
		return "kfaked (franz-go kfake, 1 broker on 127.0.0.1, 3 partitions, segment files on disk)"
	}
	n := len(a.Nodes())
	rf, minISR := min(3, n), 1
	if n >= 3 {
		minISR = 2
	}
	var jvm []string
	if pids := e.brokerProcs(); len(pids) > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0])); err == nil {
			for _, arg := range strings.Split(string(b), "\x00") {
				if strings.HasPrefix(arg, "-X") {
					jvm = append(jvm, arg)
				}
			}
		}
	}
	java := "java"
	if out, err := exec.Command("java", "-version").CombinedOutput(); err == nil {
		line, _, _ := strings.Cut(string(out), "\n")
		java = strings.TrimSpace(line)
	}
	return fmt.Sprintf("Apache Kafka %s, %d KRaft node(s) (broker+controller each) on 127.0.0.1; %s %s; topics 3 partitions, RF %d, min.insync.replicas %d",
		a.Version(), n, java, strings.Join(jvm, " "), rf, minISR)
}

// Close stops everything StartEnv and StartBroker started and removes the
// temp dirs.
func (e *Env) Close() {
	e.hogs.close()
	e.StopBroker()
	if e.PG != nil {
		e.PG.Close()
	}
	if e.logDir != "" {
		os.RemoveAll(e.logDir)
	}
}

func (e *Env) progress(format string, args ...any) {
	if e.cfg.Progress != nil {
		fmt.Fprintf(e.cfg.Progress, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

// world is one case's database: the outbox table, the publication, slots
// and the topic its events go to.
type world struct {
	env   *Env
	name  string
	db    string
	dsn   string
	conn  *pgx.Conn
	agg   string // aggregatetype: the topic is outbox.event.<agg>
	topic string
	slots []string
}

// newWorld (re)creates database bench_<name> with the outbox table in
// Debezium's layout plus the polling publisher's published_at column and
// its partial index (every case uses the same table so WAL volume per
// event is the same), a publish='insert' publication and the topic.
func (e *Env) newWorld(ctx context.Context, name string) (*world, error) {
	// The topic is unique per world even when a name repeats, so a consumer
	// reading from the start never sees an earlier run's records.
	e.worlds++
	w := &world{env: e, name: name, db: "bench_" + name, agg: fmt.Sprintf("bench_%s_%d", name, e.worlds)}
	w.topic = "outbox.event." + w.agg
	var err error
	if w.dsn, err = e.PG.NewDatabase(ctx, w.db); err != nil {
		return nil, err
	}
	if w.conn, err = e.PG.Connect(ctx, w.db); err != nil {
		return nil, err
	}
	outbox, err := harness.OutboxSchema("outboxd", "insert")
	if err != nil {
		return nil, err
	}
	for _, sql := range []string{
		outbox,
		// The polling baseline's bookkeeping.
		`ALTER TABLE outbox ADD COLUMN published_at timestamptz`,
		`CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL`,
	} {
		if _, err := w.conn.Exec(ctx, sql); err != nil {
			w.conn.Close(context.Background())
			return nil, fmt.Errorf("%s: %w", strings.Fields(sql)[0]+" "+strings.Fields(sql)[1], err)
		}
	}
	if e.mq != nil {
		if err := e.mq.prepare(ctx, w); err != nil {
			w.conn.Close(context.Background())
			return nil, err
		}
		return w, nil
	}
	// Replication factor -1: the broker's default (3 on the Apache cluster).
	resp, err := e.adm.CreateTopics(ctx, 3, -1, nil, w.topic)
	if err != nil {
		return nil, fmt.Errorf("creating topic %s: %w", w.topic, err)
	}
	if r, err := resp.On(w.topic, nil); err == nil && r.Err != nil && !strings.Contains(r.Err.Error(), "TOPIC_ALREADY_EXISTS") {
		return nil, fmt.Errorf("creating topic %s: %w", w.topic, r.Err)
	}
	return w, nil
}

// createSlot creates a pgoutput slot at the current WAL position.
func (w *world) createSlot(ctx context.Context, slot string) error {
	if _, err := w.conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		return fmt.Errorf("creating slot %s: %w", slot, err)
	}
	w.slots = append(w.slots, slot)
	return nil
}

// drop removes the database and its slots so their WAL can be recycled.
func (w *world) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w.conn.Close(ctx)
	conn, err := w.env.PG.Connect(ctx, "postgres")
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, w.db)
	for range 500 {
		var left int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, w.db).Scan(&left); err != nil || left == 0 {
			break
		}
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, w.db)
		_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, w.db)
		time.Sleep(20 * time.Millisecond)
	}
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{w.db}.Sanitize()+" WITH (FORCE)")
}

// topicCount is the number of records in the world's topic: the sum of its
// partitions' end offsets.
func (w *world) topicCount(ctx context.Context) (int64, error) {
	if w.env.mq != nil {
		return w.env.mq.count(ctx, w)
	}
	ends, err := w.env.adm.ListEndOffsets(ctx, w.topic)
	if err != nil {
		return 0, err
	}
	var n int64
	var errs []error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			errs = append(errs, o.Err)
			return
		}
		n += o.Offset
	})
	return n, errors.Join(errs...)
}

// slotConfirmed returns the slot's confirmed_flush_lsn and active pid.
func (w *world) slotConfirmed(ctx context.Context, slot string) (uint64, int, error) {
	s, err := harness.SlotInfo(ctx, w.conn, slot)
	if err != nil {
		return 0, 0, err
	}
	return s.ConfirmedFlushLSN, s.ActivePID, nil
}

func (e *Env) setBrokerPIDs(pids []int) {
	e.pidsMu.Lock()
	defer e.pidsMu.Unlock()
	e.brokerPIDs = pids
}

func (e *Env) brokerProcs() []int {
	e.pidsMu.Lock()
	defer e.pidsMu.Unlock()
	return e.brokerPIDs
}
