// Package outboxd is the relay engine: it streams committed outbox rows from
// a PostgreSQL pgoutput slot to a broker and confirms the slot only up to
// what the broker has acknowledged. cmd/outboxd wires it from flags; a Go
// service can embed it the same way:
//
//	rt, _ := router.New(router.Config{})
//	sk, _ := kafka.New(kafka.Config{Brokers: brokers})
//	r, err := outboxd.New(outboxd.Config{Postgres: dsn, Router: rt, Sink: sk})
//	go http.ListenAndServe("127.0.0.1:9187", r.Handler(false))
//	err = r.Run(ctx) // until ctx ends
//
// Exactly-once is Config.Delivery ExactlyOnce with a transactional sink
// (TxnSink, Checkpoints; see Example_exactlyOnce).
//
// docs/architecture.md walks through the package: an event's path and an
// ack's path file by file, the goroutines, the invariants, and where a
// broker or a delivery guarantee (mode.go) plugs in.
package outboxd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/sysid"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Config configures a Relay. Zero durations and sizes take the defaults
// cmd/outboxd documents for its flags of the same names.
type Config struct {
	Postgres    string // connection string of an ordinary connection; replication=database is added
	Slot        string // the pgoutput slot, created if missing (default "outboxd")
	Publication string // its outbox tables (default "outboxd")
	Router      *router.Router
	Sink        sink.Sink
	Logger      *slog.Logger // default: discard
	Version     string       // outboxd_build_info's version label

	MaxInflightEvents  int            // events handed to the sink and not yet acked before reading pauses (4096)
	MaxInflightBytes   int64          // the same in bytes (16 MiB)
	StatusInterval     time.Duration  // the longest gap between standby status updates (10s)
	ConfirmInterval    time.Duration  // the shortest gap between confirmations while events flow (25ms)
	ReplicationTimeout time.Duration  // silence after which the connection is presumed dead (30s)
	ShutdownTimeout    time.Duration  // on shutdown, the wait for in-flight acks (30s)
	ReleaseAfter       time.Duration  // a full in-flight window without acks this long lets go of the connection (5s)
	MaxMessageBytes    int            // a record larger than this is an invalid event, not a broker error (1000012)
	OnInvalid          OnInvalid      // OnInvalidFail (hold before the event, default) or OnInvalidDeadLetter
	DeadLetterTopic    string         // with OnInvalidDeadLetter (default "outboxd.deadletter")
	MessagePrefix      string         // the table-less outbox's pg_logical_emit_message prefix ("" disables)
	HeartbeatInterval  time.Duration  // heartbeat messages measuring replication delay (0 disables)
	PollInterval       time.Duration  // slot and broker polls (5s)
	MaxSlotLag         int64          // slot lag above which the relay warns and is not ready (0 disables)
	Warnings           []string       // insecure settings found at startup, shown on /status
	SlotFailover       SlotFailover   // create the slot as a failover slot (PostgreSQL 17+): SlotFailoverAuto (default), SlotFailoverTrue, SlotFailoverFalse
	PgoutputBinary     PgoutputBinary // PgoutputBinaryOff (default): text; PgoutputBinaryAuto: pgoutput's binary mode where the router renders every published column type (binary.go)
	// Draining, if set, is told when the replication stream turns busy (a
	// backlog draining: true) and quiet again (false), once per turn, from
	// the goroutine that reads the stream (wal.StartOptions.Draining); it
	// must be quick. outboxd run switches its CPU scheduling policy with it.
	Draining func(draining bool)
	// Encoder, if set, rewrites each routed record's value before the sink
	// gets it (the schema registry: package schema). A payload it cannot
	// encode takes the OnInvalid path; any other error of it holds delivery
	// at the event, as a broker outage does.
	Encoder sink.Encoder

	// Delivery is the promise to consumers: AtLeastOnce (the default) or
	// ExactlyOnce, which needs TxnSink and Checkpoints. In ExactlyOnce,
	// Run first names the checkpoint record after the PostgreSQL system,
	// registers the producer (fencing a previous instance) and reads the
	// checkpoint, waiting for the broker and PostgreSQL as long as it takes
	// (Handler's /readyz says so meanwhile); when another instance streams
	// from the slot it registers nothing and stands by instead.
	Delivery Delivery

	// ProgressStore keeps, in at-least-once mode, the record of how far
	// outboxd has published that outlives the slot, for the gap check
	// (atleastonce.go; exactly-once mode uses the checkpoint). AcceptGap lets
	// outboxd continue past a reported gap. NewProgressStore, instead,
	// builds the store once Run has read the record's key ("<system
	// id>/<slot>", so that clusters sharing the record's home never read
	// each other's), waiting for PostgreSQL to answer.
	ProgressStore    sink.ProgressStore
	NewProgressStore func(key string) sink.ProgressStore
	AcceptGap        bool
	// IgnoreTables are publication tables ("schema.table") whose rows are
	// not outbox events: the startup check lets them pass and the stream
	// skips their changes (ignoretable.go). For a publication shared with
	// other consumers, such as Debezium's FOR ALL TABLES one.
	IgnoreTables []string

	// TxnSink is exactly-once mode's transactional sink (usually Sink
	// itself), and Checkpoints binds it to this slot's checkpoint record
	// at startup (see CheckpointBinding): Run calls it once, before it
	// reads the checkpoint with TxnSink.LoadCheckpoint.
	TxnSink     sink.Transactional
	Checkpoints func(ctx context.Context, b CheckpointBinding) error
	// SplitAge: a broker transaction this old commits even in the middle
	// of a PostgreSQL transaction (a quarter of the transaction timeout).
	SplitAge time.Duration
}

// DefaultMaxInflightEvents is Config.MaxInflightEvents's default, on every
// broker: about 20 ms of a drain at 200,000 events/s, enough to keep a
// broker busy, and small enough that a full window of small events stays
// well within the Go memory limit outboxd sets from --max-inflight-bytes.
// At 16,384 (Kafka's default until 2026-12-03) a full window brought the
// live heap near that limit, where the collector runs far more often: on
// one Apache node outboxd spent 2.00× the walsender's CPU per event at 100
// events per transaction against 0.73× at 4,096, and drained no faster
// (results/bench-2026-12-03-1053 and -1046; docs/performance.md, section 7).
const DefaultMaxInflightEvents = 4096

const heartbeatPrefix = "outboxd.heartbeat"

// heartbeatPrefix is the prefix of outboxd's heartbeat messages, or ""
// without heartbeats.
func (c *Config) heartbeatPrefix() string {
	if c.HeartbeatInterval <= 0 {
		return ""
	}
	return heartbeatPrefix
}

// wantMessages: pgoutput decodes and ships every pg_logical_emit_message of
// the database when asked for messages, which any role with CONNECT may
// emit (EXECUTE is granted to PUBLIC), so they are requested only when
// something consumes them: the table-less outbox or heartbeats.
func (c *Config) wantMessages() bool { return c.MessagePrefix != "" || c.heartbeatPrefix() != "" }

// maxBodyBytes is the largest replication message read whole: anything
// longer cannot give a record within MaxMessageBytes (bytea's hex text is
// twice its bytes; the rest is framing), so the stream reads only its start
// and the event is invalid, never a spike in memory.
func (c *Config) maxBodyBytes() int { return 2*c.MaxMessageBytes + 64<<10 }

func (c *Config) defaults() error {
	if c.Postgres == "" || c.Router == nil || c.Sink == nil {
		return errors.New("outboxd: Config needs Postgres, Router and Sink")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Slot == "" {
		c.Slot = "outboxd"
	}
	if err := validateIgnoreTables(c.IgnoreTables); err != nil {
		return err
	}
	if c.Publication == "" {
		c.Publication = "outboxd"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxInflightEvents == 0 {
		c.MaxInflightEvents = DefaultMaxInflightEvents
	}
	if c.MaxInflightBytes == 0 {
		c.MaxInflightBytes = 16 << 20
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 1000012
	}
	def(&c.StatusInterval, 10*time.Second)
	def(&c.ConfirmInterval, 25*time.Millisecond)
	def(&c.ReplicationTimeout, 30*time.Second)
	def(&c.ShutdownTimeout, 30*time.Second)
	def(&c.ReleaseAfter, 5*time.Second)
	def(&c.PollInterval, 5*time.Second)
	def(&c.SplitAge, 15*time.Second)
	switch {
	case c.Delivery == ExactlyOnce && (c.TxnSink == nil || c.Checkpoints == nil):
		return errors.New("outboxd: Delivery ExactlyOnce needs TxnSink and Checkpoints (a transactional sink; sink/kafka's with Transactional set)")
	case c.Delivery != ExactlyOnce && c.Delivery != AtLeastOnce:
		return fmt.Errorf("outboxd: unknown %s", c.Delivery)
	case c.Delivery == ExactlyOnce && (c.ProgressStore != nil || c.NewProgressStore != nil):
		return errors.New("outboxd: exactly-once mode keeps its progress in the checkpoint: leave ProgressStore and NewProgressStore unset")
	case c.ProgressStore != nil && c.NewProgressStore != nil:
		return errors.New("outboxd: set ProgressStore or NewProgressStore, not both")
	}
	if err := c.validChoices(); err != nil {
		return err
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = "outboxd.deadletter"
	}
	return nil
}

// Relay is one outboxd: the replication session loop and its monitor.
type Relay struct {
	relay    *relay
	monitor  *monitor
	progress *progress
	m        *metrics
	st       *state

	// Seams of Run's startup (prepare); tests script them.
	key      func(ctx context.Context, dsn, slot string) (string, error)
	identify func(ctx context.Context, dsn string) (wal.System, error)
	slotBusy func(ctx context.Context, dsn, slot string, staleAfter time.Duration) bool
}

// New checks cfg and builds the relay; it contacts nothing.
func New(cfg Config) (*Relay, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	st := &state{dsn: cfg.Postgres, slotName: cfg.Slot, maxSlotLag: cfg.MaxSlotLag, warnings: cfg.Warnings}
	m := newMetrics(cfg.Version, st)
	m.reconnects.WithLabelValues(brokerLabel(cfg.Sink)) // present at 0 from the start, so rate() works
	mo := &monitor{
		dsn: cfg.Postgres, slot: cfg.Slot, interval: cfg.PollInterval, heartbeatInterval: cfg.HeartbeatInterval,
		maxSlotLag: cfg.MaxSlotLag, log: cfg.Logger, m: m, st: st, sink: cfg.Sink,
	}
	r := &relay{
		cfg: cfg, log: cfg.Logger, router: cfg.Router, sink: cfg.Sink, m: m, state: st,
		poison: map[eventPos]string{}, published: map[string]prometheus.Counter{},
		onHeartbeat: mo.onHeartbeat, holdRetry: time.Second,
	}
	if w, ok := cfg.TxnSink.(sink.CheckpointWatcher); ok && cfg.TxnSink != nil {
		mo.watcher = w
	}
	prog := &progress{log: cfg.Logger, st: st, kick: make(chan struct{}, 1)}
	if cfg.TxnSink != nil {
		prog.fromCheckpoint(0, true)
		prog.checkpoint = cfg.TxnSink.LoadCheckpoint
	} else {
		prog.store = cfg.ProgressStore
	}
	r.progress = prog
	r.mode = newMode(&r.cfg, r.log, st, m, prog)
	switch { // until Run's startup is done (prepare)
	case cfg.Delivery == ExactlyOnce:
		st.starting = startingCheckpoint
	case cfg.NewProgressStore != nil:
		st.starting = startingSystemID
	}
	return &Relay{relay: r, monitor: mo, progress: prog, m: m, st: st, key: sysid.Key, identify: sysid.Identify, slotBusy: slotBusy}, nil
}

// Run streams until ctx ends, then drains what is in flight (up to
// ShutdownTimeout) and sends the final confirmation. It returns nil after a
// clean shutdown, and an error only for what a restart with the same
// configuration cannot fix (a slot or publication problem, bad credentials,
// another instance fencing this one). It owns two goroutines: its caller's,
// which runs the replication sessions, and the monitor's, which it stops and
// waits for before returning (and, in at-least-once mode, the progress
// writer's).
func (r *Relay) Run(ctx context.Context) error {
	if err := r.prepare(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting
		}
		return err
	}
	mctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	r.progress.start(ctx)
	wg.Add(2)
	go func() {
		defer wg.Done()
		r.monitor.run(mctx)
	}()
	go func() {
		defer wg.Done()
		r.progress.run(mctx)
	}()
	err := r.relay.run(ctx)
	stop()
	wg.Wait()
	r.progress.final() // after the last confirmation: a short run leaves a record too
	return err
}

// prepare is Run's startup before the first session: the mode's (the
// progress record's key; the checkpoint). The HTTP handler answers
// meanwhile: /readyz 503 with the reason, /status "starting".
func (r *Relay) prepare(ctx context.Context) error { return r.relay.mode.prepare(ctx, r) }

// TopicHeld tells the relay that the sink holds the events of topic (err
// says why: the topic is missing and may not be created) or, with a nil
// err, no longer does; /readyz and /status show it.
func (r *Relay) TopicHeld(topic string, err error) { r.st.setTopicHold(topic, err) }

// Handler serves /metrics, /healthz, /readyz, /status and, with pprof,
// /debug/pprof. It has no authentication: serve it on loopback or behind
// the network boundary.
func (r *Relay) Handler(pprof bool) http.Handler { return newHTTPHandler(r.m, r.st, pprof) }
