// Package bench measures outboxd against what bounds it and what it
// replaces, on one throwaway PostgreSQL server and one kfaked broker, in one
// run: backlog drain throughput beside a read-only pgoutput reader (the
// walsender's ceiling) and a polling publisher, commit-to-consumer latency at
// fixed write rates, CPU and memory use, and the cost of exactly-once mode
// (drain throughput and latency beside at-least-once). `make bench` runs it through
// test/cmd/bench; bench_test.go runs one small case so the code keeps working.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
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
	OutboxdArgs     []string        // appended to outboxd's command line
	OutboxdEnv      []string        // added to outboxd's environment (KEY=VALUE), e.g. GOMAXPROCS=1
	Cases           map[string]bool // drain, latency, resources, eos, debezium
	Debezium        DebeziumConfig  // the debezium case (debezium.go)
	SkipPolling     bool            // drain cases without the polling publisher
	PerfDir         string          // if set, `perf record` outboxd and its walsender during drains
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
		LatencyDuration: 20 * time.Second,
		PollIntervals:   []time.Duration{500 * time.Millisecond, 10 * time.Millisecond},
		BigTxnRows:      1_000_000,
		LargeEvents:     20_000,
		LargePayload:    4096,
		Cases:           map[string]bool{"drain": true, "latency": true, "resources": true, "eos": true, "debezium": true},
		Debezium:        defaultDebezium(quick),
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

// Env is the servers and the binary every case shares.
type Env struct {
	cfg    Config
	PG     *harness.Postgres
	Kafka  *harness.Kafka
	bin    string
	logDir string
	kcl    *kgo.Client
	adm    *kadm.Client

	postmasterPID int
	kfakedPID     int
	Machine       Machine
	PGSettings    string
	worlds        int // worlds created so far
	Restarts      int // servers found dead and restarted between cases
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.state != 'Z'
}

// checkServers fails when kfaked or PostgreSQL died: something outside the
// bench stopped them (other processes on a shared machine), or they crashed.
func (e *Env) checkServers() error {
	if e.kfakedPID > 0 && !alive(e.kfakedPID) {
		return fmt.Errorf("kfaked (pid %d) exited during the case; log: %s", e.kfakedPID, e.Kafka.LogFile())
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
	if err := e.Kafka.Start(ctx); err != nil {
		return err
	}
	e.postmasterPID = postmasterPID(e.PG.Dir())
	if lf := e.Kafka.LogFile(); lf != "" {
		e.kfakedPID = findProc("-data-dir " + filepath.Join(filepath.Dir(lf), "data"))
	}
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

// StartEnv builds outboxd and starts PostgreSQL and kfaked. Close it.
func StartEnv(ctx context.Context, cfg Config) (_ *Env, err error) {
	e := &Env{cfg: cfg, Machine: describeMachine()}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	e.progress("building outboxd and kfaked")
	if e.bin, err = harness.BuildBinary(ctx, "./cmd/outboxd"); err != nil {
		return nil, err
	}
	if e.logDir, err = os.MkdirTemp("", "outboxd-bench-"); err != nil {
		return nil, err
	}
	e.progress("starting PostgreSQL")
	var opts []harness.PGOption
	for _, kv := range benchConf {
		opts = append(opts, harness.WithConf(kv[0], kv[1]))
	}
	if e.PG, err = harness.StartPostgres(ctx, opts...); err != nil {
		return nil, err
	}
	e.progress("starting kfaked")
	if e.Kafka, err = harness.StartKafka(ctx); err != nil {
		return nil, err
	}
	copts, err := e.Kafka.ClientOpts()
	if err != nil {
		return nil, err
	}
	if e.kcl, err = kgo.NewClient(copts...); err != nil {
		return nil, err
	}
	e.adm = kadm.NewClient(e.kcl)
	e.postmasterPID = postmasterPID(e.PG.Dir())
	if lf := e.Kafka.LogFile(); lf != "" {
		e.kfakedPID = findProc("-data-dir " + filepath.Join(filepath.Dir(lf), "data"))
	}
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

// Close stops everything StartEnv started and removes the temp dirs.
func (e *Env) Close() {
	if e.kcl != nil {
		e.kcl.Close()
	}
	if e.Kafka != nil {
		e.Kafka.Close()
	}
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
	for _, sql := range []string{
		`CREATE TABLE outbox (
			id            uuid         PRIMARY KEY,
			aggregatetype varchar(255) NOT NULL,
			aggregateid   varchar(255) NOT NULL,
			type          varchar(255) NOT NULL,
			payload       jsonb        NOT NULL,
			created_at    timestamptz  NOT NULL DEFAULT now(),
			published_at  timestamptz)`,
		`CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL`,
		`CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')`,
	} {
		if _, err := w.conn.Exec(ctx, sql); err != nil {
			w.conn.Close(context.Background())
			return nil, fmt.Errorf("%s: %w", strings.Fields(sql)[0]+" "+strings.Fields(sql)[1], err)
		}
	}
	resp, err := e.adm.CreateTopics(ctx, 3, 1, nil, w.topic)
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
