package inbox_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/results"
	"github.com/outboxd/outboxd/test/harness"
)

var (
	benchN       = flag.Int("bench-events", 10000, "events per run of -bench-effects")
	benchBrokers = flag.String("bench-brokers", "kafka,nats,rabbitmq", "the brokers -bench-effects measures, comma-separated")
	resultsDir   = flag.String("results", "", "-bench-effects: write the run as a results file (inbox-bench-<date>-<time>.json) into this directory (make bench-inbox: results/)")
)

// benchBroker is one broker under TestInboxBench: it publishes n events as
// outboxd would (id header, key in the broker's key header, 16 keys) and
// consumes them naively.
type benchBroker interface {
	// load puts n events on topic (a Kafka topic, a NATS subject with
	// its own stream, a RabbitMQ queue) and returns once the broker holds
	// them all, so that no run measures the publisher.
	load(topic string, n int)
	// config is cfg on this broker, consuming topic.
	config(topic string, cfg inbox.Config) inbox.Config
	// naive starts the consumer everyone writes first on topic.
	naive(topic string, apply inbox.Handler) (stop func())
}

// TestInboxBench (-bench-effects) measures effects per second on this
// machine, on each broker of -bench-brokers: package inbox at 1 and 100
// events per database transaction, at 1 with 4 key workers per lane
// (KeyWorkers), and a hand-written naive consumer (auto-commit or auto-ack,
// the same effect in a transaction per event, no inbox row) in the same run,
// on the same PostgreSQL, so that the cost of the guarantee is a ratio of
// two figures measured side by side. The effect is what billing does: insert
// a ledger row and update the key's balance. Each run reads -bench-events
// events (16 keys; 3 partitions on Kafka) from its own topic and group; the
// clock runs from the first effect to the last, so the group join is not
// counted (each effect row carries its insert time). With -results DIR the run is a results file (docs/inbox.md quotes
// it), marked busy when the load average was above 1 per core.
func TestInboxBench(t *testing.T) {
	if !*benchEffects {
		t.Skip("-bench-effects not set")
	}
	// The commit before anything runs: a tree edited during the run must
	// not make the file name code the run did not measure.
	started, loadStart, commit := time.Now(), loadAvg(), results.Commit()
	b := newBench(t)
	// The bench outlives newBench's 4 minutes: 4 runs per broker.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	t.Cleanup(cancel)
	b.ctx = ctx
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE balances (k text PRIMARY KEY, n bigint NOT NULL);
		INSERT INTO balances SELECT 'k' || i, 0 FROM generate_series(0, 15) i;
		ALTER TABLE effects ADD COLUMN at timestamptz NOT NULL DEFAULT clock_timestamp();`); err != nil {
		t.Fatal(err)
	}
	n := *benchN
	apply := func(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 1)`, ev.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE balances SET n = n + 1 WHERE k = $1`, string(ev.Key))
		return err
	}
	measure := func(bb benchBroker, topic string, start func() (stop func())) float64 {
		bb.load(topic, n)
		if _, err := b.pool.Exec(b.ctx, `TRUNCATE effects`); err != nil {
			t.Fatal(err)
		}
		stop := start()
		defer stop()
		for b.count(`SELECT count(*) FROM effects`) < n {
			time.Sleep(10 * time.Millisecond)
		}
		// From the first effect's insert to the last's, by PostgreSQL's
		// clock: what polling would blur on a short run.
		var secs float64
		if err := b.pool.QueryRow(b.ctx, `SELECT extract(epoch FROM max(at) - min(at))::float8 FROM effects`).Scan(&secs); err != nil {
			t.Fatal(err)
		}
		if secs <= 0 {
			t.Fatalf("%d effects in %vs: raise -bench-events", n, secs)
		}
		return float64(n-1) / secs
	}
	rep := &benchReport{started: started, commit: commit, loadStart: loadStart, events: n, brokers: *benchBrokers}
	for _, name := range strings.Split(*benchBrokers, ",") {
		var bb benchBroker
		switch name {
		case "kafka":
			bb = b
			rep.settings = append(rep.settings, "Kafka "+b.kafka.Kind()+" (3 partitions)")
		case "nats":
			bb = newNATSBench(b)
			rep.settings = append(rep.settings, "NATS JetStream (file stream)")
		case "rabbitmq":
			bb = newRabbitBench(b)
			rep.settings = append(rep.settings, "RabbitMQ (classic queue)")
		default:
			t.Fatalf("-bench-brokers: %q is not kafka, nats or rabbitmq", name)
		}
		naiveTopic := "bench." + name + ".naive"
		naive := measure(bb, naiveTopic, func() func() { return bb.naive(naiveTopic, apply) })
		for _, r := range []struct{ batch, workers int }{{1, 1}, {100, 1}, {1, 4}} {
			topic := fmt.Sprintf("bench.%s.inbox_%d_%d", name, r.batch, r.workers)
			cfg := inbox.Config{Group: "g-" + strings.ReplaceAll(topic, ".", "_"), Handler: apply, Retention: -1, BatchSize: r.batch, KeyWorkers: r.workers}
			rate := measure(bb, topic, func() func() { return b.runOn(bb.config(topic, cfg)) })
			rep.add(name, r.batch, r.workers, rate, naive)
			t.Logf("%-8s inbox batch %-3d key workers %d %8.0f effects/s (%.2f of naive)", name, r.batch, r.workers, rate, rate/naive)
		}
		rep.addNaive(name, naive)
		t.Logf("%-8s naive                         %8.0f effects/s", name, naive)
	}
	rep.loadEnd = loadAvg()
	fmt.Fprint(os.Stderr, results.Markdown(rep.table))
	if *resultsDir == "" {
		return
	}
	p, err := results.Write(*resultsDir, rep.file())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("results file: %s", p)
}

// benchReport is what TestInboxBench measured, as a table, figures and a
// results file.
type benchReport struct {
	started                    time.Time
	commit, loadStart, loadEnd string
	events                     int
	brokers                    string
	settings                   []string // per broker, in run order
	table                      [][]string
	figures                    map[string]string
}

// add records an inbox run on broker: rate effects/s with batch events per
// transaction and workers key workers, beside the naive consumer's naive.
func (r *benchReport) add(broker string, batch, workers int, rate, naive float64) {
	if r.table == nil {
		r.table = [][]string{{"broker", "consumer", "events per transaction", "key workers", "effects/s", "÷ naive"}}
		r.figures = map[string]string{}
	}
	r.table = append(r.table, []string{broker, "inbox", strconv.Itoa(batch), strconv.Itoa(workers), fmt.Sprintf("%.0f", rate), fmt.Sprintf("%.2f", rate/naive)})
	key := fmt.Sprintf("%s-batch%d-workers%d", broker, batch, workers)
	r.figures[key] = fmt.Sprintf("%.0f effects/s", rate)
	r.figures[key+"-ratio"] = fmt.Sprintf("%.2f", rate/naive)
}

// addNaive records the naive consumer's run on broker (after its add calls).
func (r *benchReport) addNaive(broker string, naive float64) {
	r.table = append(r.table, []string{broker, "naive", "1", "1", fmt.Sprintf("%.0f", naive), "1.00"})
	r.figures[broker+"-naive"] = fmt.Sprintf("%.0f effects/s", naive)
}

// file is the run as a results file (package results), busy when the load
// average was above one per core at its start or end.
func (r *benchReport) file() *results.File {
	return &results.File{
		Name:    "inbox-bench-" + r.started.UTC().Format("2006-01-02-1504"),
		Source:  "make bench-inbox",
		Commit:  r.commit,
		Date:    r.started.UTC().Format(time.RFC3339),
		Machine: fmt.Sprintf("%d cores, %s, PostgreSQL 15 from the harness", runtime.NumCPU(), runtime.Version()),
		Load:    fmt.Sprintf("load average %s at start, %s at end", r.loadStart, r.loadEnd),
		Busy:    overloaded(r.loadStart) || overloaded(r.loadEnd),
		Settings: fmt.Sprintf("go test -run TestInboxBench ./test/inbox/ -bench-effects -bench-events %d -bench-brokers %s; %s; 16 keys; effect: one INSERT and one UPDATE",
			r.events, r.brokers, strings.Join(r.settings, ", ")),
		Tables:  map[string][][]string{"main": r.table},
		Figures: r.figures,
		Notes: []string{"The naive consumer auto-commits (Kafka, every 5 s) or auto-acks (NATS AckNone, RabbitMQ autoAck), applies each event in a transaction of its own and writes no inbox row: a crash or redelivery applies effects twice or never.",
			"÷ naive is effects/s over the naive consumer's on the same broker in the same run."},
	}
}

// TestInboxBench's measurements become a results file that package results
// loads: the ratio over the naive consumer as a figure, the table, and the
// busy mark when the load average was above one per core.
func TestInboxBenchResultsFile(t *testing.T) {
	cores := float64(runtime.NumCPU())
	for _, c := range []struct {
		loadStart, loadEnd string
		busy               bool
	}{
		{fmt.Sprintf("%.2f 1.00 1.00", cores/2), fmt.Sprintf("%.2f 1.00 1.00", cores), false},
		{fmt.Sprintf("%.2f 1.00 1.00", cores/2), fmt.Sprintf("%.2f 1.00 1.00", cores+0.5), true},
		{fmt.Sprintf("%.2f 1.00 1.00", cores+0.5), "?", true},
	} {
		rep := &benchReport{started: time.Date(2026, 12, 2, 12, 41, 21, 0, time.UTC), commit: "a5677e96e82d",
			loadStart: c.loadStart, loadEnd: c.loadEnd, events: 10000, brokers: "nats", settings: []string{"NATS JetStream (file stream)"}}
		rep.add("nats", 1, 1, 2000, 5000)
		rep.add("nats", 100, 1, 7500, 5000)
		rep.addNaive("nats", 5000)
		dir := t.TempDir()
		if _, err := results.Write(dir, rep.file()); err != nil {
			t.Fatal(err)
		}
		files, err := results.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		f := files["inbox-bench-2026-12-02-1241"]
		if f == nil {
			t.Fatalf("files %v, want inbox-bench-2026-12-02-1241", slices.Collect(maps.Keys(files)))
		}
		if f.Busy != c.busy {
			t.Errorf("load %s, %s on %v cores: busy %v, want %v", c.loadStart, c.loadEnd, cores, f.Busy, c.busy)
		}
		want := map[string]string{"nats-batch1-workers1": "2000 effects/s", "nats-batch1-workers1-ratio": "0.40",
			"nats-batch100-workers1": "7500 effects/s", "nats-batch100-workers1-ratio": "1.50", "nats-naive": "5000 effects/s"}
		if !maps.Equal(f.Figures, want) {
			t.Errorf("figures %v, want %v", f.Figures, want)
		}
		if got := f.Tables["main"]; len(got) != 4 || !slices.Equal(got[3], []string{"nats", "naive", "1", "1", "5000", "1.00"}) {
			t.Errorf("table %q", got)
		}
	}
}

// loadAvg is /proc/loadavg's three averages ("?" where there is none).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil || len(strings.Fields(string(b))) < 3 {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// overloaded: a 1-minute load average above one per core means other work
// competed for the CPU the figures were measured on.
func overloaded(load string) bool {
	v, err := strconv.ParseFloat(strings.Fields(load + " ?")[0], 64)
	return err == nil && v > float64(runtime.NumCPU())
}

// load on Kafka: a 3-partition topic.
func (b *bench) load(topic string, n int) { b.publish(topic, 0, n) }

func (b *bench) config(topic string, cfg inbox.Config) inbox.Config {
	cfg.Brokers, cfg.Topics = b.kafka.Brokers(), []string{topic}
	return cfg
}

// naive is the consumer everyone writes first: autocommitted offsets (every
// 5s, whatever was polled), the effect in a transaction of its own, no inbox
// row, so a crash or rebalance applies some effects twice (or, with the
// offsets committed before the effect, never).
func (b *bench) naive(topic string, apply inbox.Handler) (stop func()) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Brokers()...), kgo.ConsumerGroup("naive-"+topic), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				b.naiveApply(ctx, apply, &inbox.Event{ID: string(r.Headers[0].Value), Key: r.Key, Value: r.Value})
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }
}

// naiveApply applies ev in a transaction of its own, ignoring the error as
// a naive consumer that has already acked can only log it.
func (b *bench) naiveApply(ctx context.Context, apply inbox.Handler, ev *inbox.Event) {
	_ = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return apply(ctx, tx, ev) })
}

// natsBench is TestInboxBench on NATS JetStream: a stream per topic.
type natsBench struct {
	*bench
	srv *harness.NATS
	js  jetstream.JetStream
}

func newNATSBench(b *bench) *natsBench {
	b.t.Helper()
	srv := harness.NATSForTest(b.t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.t.Fatal(err)
	}
	return &natsBench{bench: b, srv: srv, js: js}
}

func streamName(topic string) string { return strings.NewReplacer(".", "_").Replace(topic) }

func (s *natsBench) load(topic string, n int) {
	s.t.Helper()
	if _, err := s.js.CreateStream(s.ctx, jetstream.StreamConfig{Name: streamName(topic), Subjects: []string{topic}}); err != nil {
		s.t.Fatal(err)
	}
	for i := range n {
		m := &nats.Msg{Subject: topic, Data: fmt.Appendf(nil, `{"n": %d}`, i), Header: nats.Header{}}
		m.Header.Set("id", fmt.Sprintf("ev-%d", i))
		m.Header.Set("Outboxd-Key", fmt.Sprintf("k%d", i%16))
		if _, err := s.js.PublishMsgAsync(m); err != nil {
			s.t.Fatal(err)
		}
	}
	select {
	case <-s.js.PublishAsyncComplete():
	case <-s.ctx.Done():
		s.t.Fatal("publishing to NATS:", s.ctx.Err())
	}
}

func (s *natsBench) config(topic string, cfg inbox.Config) inbox.Config {
	cfg.Broker, cfg.Topics = s.srv.URL(), []string{topic}
	return cfg
}

// naive on NATS: an ephemeral consumer with AckNone (delivered is done).
func (s *natsBench) naive(topic string, apply inbox.Handler) (stop func()) {
	cons, err := s.js.CreateConsumer(s.ctx, streamName(topic), jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		s.naiveApply(ctx, apply, &inbox.Event{ID: m.Headers().Get("id"), Key: []byte(m.Headers().Get("Outboxd-Key")), Value: m.Data()})
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return func() { cancel(); cc.Stop() }
}

// rabbitBench is TestInboxBench on RabbitMQ: a classic queue per topic,
// published to through the default exchange.
type rabbitBench struct {
	*bench
	srv *harness.RabbitMQ
	ch  *amqp.Channel
}

func newRabbitBench(b *bench) *rabbitBench {
	b.t.Helper()
	srv := harness.RabbitMQForTest(b.t)
	conn, err := amqp.Dial(srv.URL())
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	return &rabbitBench{bench: b, srv: srv, ch: ch}
}

func (r *rabbitBench) load(topic string, n int) {
	r.t.Helper()
	if _, err := r.ch.QueueDeclare(topic, true, false, false, false, nil); err != nil {
		r.t.Fatal(err)
	}
	for i := range n {
		msg := amqp.Publishing{Body: fmt.Appendf(nil, `{"n": %d}`, i), DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"id": fmt.Sprintf("ev-%d", i), "outboxd.key": fmt.Sprintf("k%d", i%16)}}
		if err := r.ch.PublishWithContext(r.ctx, "", topic, false, false, msg); err != nil {
			r.t.Fatal(err)
		}
	}
	for {
		q, err := r.ch.QueueDeclarePassive(topic, true, false, false, false, nil)
		if err != nil {
			r.t.Fatal(err)
		}
		if q.Messages == n {
			return
		}
		if r.ctx.Err() != nil {
			r.t.Fatalf("queue %s holds %d messages, want %d", topic, q.Messages, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *rabbitBench) config(topic string, cfg inbox.Config) inbox.Config {
	cfg.Broker, cfg.Topics = r.srv.URL(), []string{topic}
	return cfg
}

// naive on RabbitMQ: autoAck (delivered is done), no prefetch limit.
func (r *rabbitBench) naive(topic string, apply inbox.Handler) (stop func()) {
	conn, err := amqp.Dial(r.srv.URL())
	if err != nil {
		r.t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	ds, err := ch.Consume(topic, "naive", true, false, false, false, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range ds {
			key, _ := d.Headers["outboxd.key"].(string)
			id, _ := d.Headers["id"].(string)
			r.naiveApply(ctx, apply, &inbox.Event{ID: id, Key: []byte(key), Value: d.Body})
		}
	}()
	return func() { cancel(); conn.Close(); <-done }
}
