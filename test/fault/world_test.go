package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/results"
	"github.com/outboxd/outboxd/test/harness"
)

// faultKind names one injected fault.
type faultKind string

const (
	faultKill            faultKind = "kill"              // SIGKILL outboxd at a random moment, restart it
	faultKillUnderLag    faultKind = "kill-under-lag"    // SIGKILL outboxd while the slot lags (a burst in flight), restart it
	faultKillBrokerDown  faultKind = "kill-broker-down"  // SIGKILL outboxd and restart it while the broker is stopped
	faultTerm            faultKind = "term"              // SIGTERM outboxd (must exit 0 in time), restart it
	faultTermBrokerStall faultKind = "term-broker-stall" // the same while the broker is frozen
	faultBrokerStop      faultKind = "broker-stop"       // clean broker stop, restart with its data
	faultBrokerStall     faultKind = "broker-stall"      // SIGSTOP the broker, SIGCONT later
	faultPGRestart       faultKind = "pg-restart"        // pg_ctl restart -m fast
	faultPGCrash         faultKind = "pg-crash"          // pg_ctl restart -m immediate (crash recovery)
	faultBrokerLongStall faultKind = "broker-long-stall" // SIGSTOP longer than the producer's request timeout
	faultWalsenderKill   faultKind = "walsender-kill"    // pg_terminate_backend of the slot's walsender
	faultPGProxyCut      faultKind = "pg-proxy-cut"      // network faults between outboxd and PostgreSQL
	faultPGProxyStall    faultKind = "pg-proxy-stall"
	faultPGProxyDelay    faultKind = "pg-proxy-delay"
	faultKafkaCut        faultKind = "kafka-proxy-cut" // network faults between outboxd and Kafka
	faultKafkaStall      faultKind = "kafka-proxy-stall"
	faultKafkaDelay      faultKind = "kafka-proxy-delay"
	// Fast restart while Kafka is stopped: the walsender waits for outboxd
	// to confirm what it sent, which it cannot; outboxd must let go of the
	// connection (fixed in 7212f2d) or the server hangs in "shutting down".
	faultPGRestartBrokerDown faultKind = "pg-restart-broker-down"

	// Silent partition of the connections open at that moment (new ones
	// pass): nothing arrives, no close is passed on.
	faultPGBlackhole    faultKind = "pg-proxy-blackhole"
	faultKafkaBlackhole faultKind = "kafka-proxy-blackhole"

	// Apache Kafka cluster faults (-kafka apache-cluster, cluster_test.go).
	faultLeaderKill     faultKind = "leader-kill"          // SIGKILL the leader of a partition outboxd writes to, restart it
	faultNodeStall      faultKind = "node-stall"           // SIGSTOP one broker (a partition leader), SIGCONT later
	faultControllerKill faultKind = "controller-kill"      // SIGKILL the active KRaft controller, restart it
	faultRollingRestart faultKind = "rolling-restart"      // clean restart of each node in turn, waiting for full ISR between
	faultTwoDown        faultKind = "two-brokers-down"     // two of three nodes down: outboxd must hold, then recover
	faultTxnCoordKill   faultKind = "txn-coordinator-kill" // exactly-once: SIGKILL the transaction coordinator's node
)

// pgRestartBound is how long a fast restart of PostgreSQL may take.
const pgRestartBound = 30 * time.Second

// scenario is one run: a load and the faults injected while it runs.
type scenario struct {
	name     string
	load     loadConfig
	faults   []faultKind   // in injection order
	spread   time.Duration // faults are spread over this much time
	warmup   time.Duration // load before the first fault
	cooldown time.Duration // load after the last fault
	catchUp  time.Duration // bound for the slot to catch up once the load stops
	// settleBound: after each fault, outboxd must confirm everything
	// written before the fault ended within this long.
	settleBound time.Duration
	// relayArgs are extra outboxd arguments (before the mode's).
	relayArgs []string
	// standby runs a second outboxd on the slot (ha_test.go).
	standby bool
	// setupRole: outboxd runs as the role `outboxd setup --role` makes,
	// not the superuser (ha_test.go, asSetupRole).
	setupRole string
}

const (
	slotName    = "fault_outboxd"
	auditSlot   = "fault_audit" // physical: pins the WAL pg_walinspect reads
	publication = "outboxd"
	dbName      = "fault"
	partitions  = 3
)

// faultEvent is one injected fault, for attributing duplicates: from its
// disruptive action (start) until outboxd confirmed everything committed
// before the fault ended (settled).
type faultEvent struct {
	kind           faultKind
	start, settled time.Time
}

// world is one scenario's processes and observers.
type world struct {
	t    *testing.T
	ctx  context.Context
	sc   scenario
	mode deliveryMode
	seed uint64
	rng  *rand.Rand

	logDir   string
	pg       *harness.Postgres
	dsn      string // direct; the test's own connections
	relayDSN string // through pgProxy
	pgProxy  *Proxy
	// kafkaProxies: one per broker, each broker advertising its own.
	kafkaProxies multiProxy
	kafka        faultKafka
	cluster      *apacheCluster // -kafka apache-cluster; nil on kfake
	bin          string
	topics       []string
	startLSN     uint64

	relayMu         sync.Mutex
	relay           *harness.Proc
	standby         *harness.Proc            // with scenario.standby (ha_test.go)
	httpAddr        map[*harness.Proc]string // each outboxd's --http-addr
	relayStarts     int
	unexpectedExits []string

	load *load
	mon  *monitor

	faultsDone  map[faultKind]int
	faultEvents []faultEvent
	faultLog    []string
	errs        []string
	started     time.Time
	// commit is the checkout's commit when the run began, the code its
	// outboxd was built from (results.Commit at the end would name what
	// the tree holds by then).
	commit string
}

func newWorld(t *testing.T, sc scenario, mode deliveryMode, seed uint64) *world {
	t.Helper()
	w := &world{t: t, sc: sc, mode: mode, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5eed)),
		faultsDone: map[faultKind]int{}, started: time.Now(), commit: results.Commit(), httpAddr: map[*harness.Proc]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.ctx = ctx
	w.logDir = t.TempDir()
	if *keepLogs != "" {
		w.logDir = filepath.Join(*keepLogs, fmt.Sprintf("%s-%s", t.Name(), time.Now().Format("150405")))
		if err := os.MkdirAll(w.logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range sc.load.aggTypes {
		w.topics = append(w.topics, "outbox.event."+a)
	}

	if os.Getenv(harness.EnvPostgres) != "" || os.Getenv(harness.EnvKafka) != "" {
		t.Skip("the fault suite restarts PostgreSQL and the broker: it needs the throwaway ones (unset OUTBOXD_TEST_POSTGRES/OUTBOXD_TEST_KAFKA)")
	}
	setupCtx, setupCancel := context.WithTimeout(ctx, 4*time.Minute)
	defer setupCancel()

	w.bin = *outboxdBin
	if w.bin == "" {
		var err error
		if w.bin, err = harness.BuildBinary(setupCtx, "./cmd/outboxd"); err != nil {
			t.Fatal(err)
		}
	}

	w.pg = harness.PostgresForTest(t)
	var err error
	if w.dsn, err = w.pg.NewDatabase(setupCtx, dbName); err != nil {
		t.Fatal(err)
	}
	w.setupSchema(setupCtx)

	// PostgreSQL side: outboxd connects through pgProxy, everything else directly.
	if w.pgProxy, err = NewProxy("pg", fmt.Sprintf("127.0.0.1:%d", w.pg.Port())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.pgProxy.Close)
	w.relayDSN = fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", w.pgProxy.Addr(), dbName)
	if sc.setupRole != "" {
		w.asSetupRole(setupCtx, sc.setupRole)
	}

	// Kafka side: every broker advertises its proxy's address (see broker.go).
	kind, err := worldKafkaKind()
	if err != nil {
		t.Fatal(err)
	}
	nBrokers := 1
	if kind == harness.KindApacheCluster {
		nBrokers = 3
	}
	for i := range nBrokers {
		p, err := NewProxy(fmt.Sprintf("kafka%d", i+1), "")
		if err != nil {
			t.Fatal(err)
		}
		w.kafkaProxies = append(w.kafkaProxies, p)
	}
	t.Cleanup(w.kafkaProxies.Close)
	switch kind {
	case harness.KindApacheCluster:
		if w.cluster, err = startApacheCluster(setupCtx, w.kafkaProxies); err != nil {
			t.Fatal(err)
		}
		w.kafka = w.cluster
	case harness.KindApache:
		// One node: the whole-broker faults act on it (w.cluster stays nil:
		// the faults of single nodes of a cluster need three).
		if w.kafka, err = startApacheCluster(setupCtx, w.kafkaProxies); err != nil {
			t.Fatal(err)
		}
	default:
		b, err := StartBroker(setupCtx, w.kafkaProxies[0].Addr(), partitions, w.logDir)
		if err != nil {
			t.Fatal(err)
		}
		w.kafkaProxies[0].SetTarget(b.Addr())
		w.kafka = b
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(w.kafka.LogTail())
		}
		w.kafka.Close()
	})
	w.createTopics(setupCtx)

	w.mon = &monitor{pgDSN: w.dsn, slot: slotName, kafkaOpts: w.kafkaOpts(), topics: w.topics,
		partitions: partitions, committed: mode.readCommitted()}
	if kind != harness.KindKfake && mode.transactional {
		w.mon.visibilityGrace = markerGrace // Apache Kafka writes commit markers after answering the commit
	}
	w.load = newLoad(sc.load, w.dsn, seed)
	t.Cleanup(func() {
		w.relayMu.Lock()
		r, sb := w.relay, w.standby
		w.relayMu.Unlock()
		if r != nil {
			_ = r.Kill()
		}
		if sb != nil {
			_ = sb.Kill()
		}
		if t.Failed() {
			path := filepath.Join(w.logDir, "outboxd.log")
			t.Logf("outboxd log tail (%s):\n%s", path, fileTail(path, 8<<10))
		}
	})
	return w
}

func (w *world) setupSchema(ctx context.Context) {
	w.t.Helper()
	conn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// Deletes are published too: insert+delete outboxes must be skipped by
	// outboxd, not just filtered by the publication.
	outbox, err := harness.OutboxSchema(publication, "insert, delete")
	if err != nil {
		w.t.Fatal(err)
	}
	for _, sql := range []string{
		outbox,
		// One row per committed writer transaction, written in that
		// transaction: the ground truth for "committed" (see load_test.go).
		`CREATE TABLE committed_txns (id bigint PRIMARY KEY, xid bigint NOT NULL, slow bool NOT NULL DEFAULT false)`,
		// Slow commits: a deferred trigger sleeps at COMMIT, before the
		// commit record is written, so that restarts land mid-COMMIT and the
		// writers see COMMITs with an unknown outcome.
		`CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON committed_txns
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.slow) EXECUTE FUNCTION slow_commit()`,
		`CREATE EXTENSION pg_walinspect`,
		`SELECT pg_create_physical_replication_slot('` + auditSlot + `', true)`,
		// Created before any event is written, so outboxd's first start
		// cannot miss early events, whatever the faults do to it.
		`SELECT pg_create_logical_replication_slot('` + slotName + `', 'pgoutput')`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			w.t.Fatalf("%s: %v", sql, err)
		}
	}
	lsn, err := harness.CurrentWALLSN(ctx, conn)
	if err != nil {
		w.t.Fatal(err)
	}
	w.startLSN = lsn
}

// kafkaOpts reach the brokers directly, never through the proxies.
func (w *world) kafkaOpts() []kgo.Opt { return w.kafka.ClientOpts() }

func (w *world) createTopics(ctx context.Context) {
	w.t.Helper()
	cl, err := kgo.NewClient(w.kafkaOpts()...)
	if err != nil {
		w.t.Fatal(err)
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, partitions, w.kafka.replicas(), nil, w.topics...)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		w.t.Fatalf("creating topics: %v", err)
	}
	if w.cluster != nil {
		// A broker may answer for a topic only once the controller's
		// metadata reached it (UNKNOWN_TOPIC_OR_PARTITION right after the
		// creation): retriable errors are asked again, for up to 30 s.
		adm, deadline := kadm.NewClient(cl), time.Now().Add(30*time.Second)
		for {
			err := w.cluster.checkProductionSettings(ctx, adm, w.topics)
			if err == nil {
				break
			}
			if !kerr.IsRetriable(err) || time.Now().After(deadline) {
				w.t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// spawnRelay starts an outboxd process.
func (w *world) spawnRelay() (*harness.Proc, error) {
	port, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := append([]string{"run",
		"--postgres", w.relayDSN, "--slot", slotName, "--publication", publication,
		"--kafka-brokers", w.kafkaProxies.Addrs(),
		"--http-addr", addr, "--confirm-interval", "20ms", "--status-interval", "1s",
		"--shutdown-timeout", relayShutdownTimeout.String(), "--log-level", "info",
	}, w.sc.relayArgs...)
	args = append(args, w.mode.outboxdArgs...)
	p, err := harness.StartProc(w.ctx, "outboxd", w.bin, args, nil, w.logDir)
	if err != nil {
		return nil, err
	}
	w.relayMu.Lock()
	w.httpAddr[p] = addr
	w.relayStarts++
	w.relayMu.Unlock()
	return p, nil
}

// startRelay starts outboxd and waits until it streams.
func (w *world) startRelay() error {
	p, err := w.spawnRelay()
	if err != nil {
		return err
	}
	w.relayMu.Lock()
	w.relay = p
	w.relayMu.Unlock()
	ctx, cancel := context.WithTimeout(w.ctx, 90*time.Second)
	defer cancel()
	up := w.mode.up
	if up == nil {
		up = harness.Streaming
	}
	w.relayMu.Lock()
	addr := w.httpAddr[p]
	w.relayMu.Unlock()
	if err := harness.WaitStatus(ctx, p, addr, "outboxd up", up); err != nil {
		return fmt.Errorf("outboxd start #%d: %w; log tail:\n%s", w.relayStarts, err, tailString(p.Log(), 2048))
	}
	return nil
}

// checkRelay notices an outboxd that exited by itself (a bug: it should
// retry everything injected here), records it and starts a new one.
func (w *world) checkRelay() {
	w.relayMu.Lock()
	p := w.relay
	w.relayMu.Unlock()
	if p == nil || !p.Exited() {
		return
	}
	code, _ := p.Wait(w.ctx)
	w.unexpectedExits = append(w.unexpectedExits, fmt.Sprintf("outboxd exited by itself with code %d at %s; log tail:\n%s",
		code, time.Now().Format("15:04:05.000"), tailString(p.Log(), 3000)))
	if err := w.startRelay(); err != nil {
		w.errs = append(w.errs, err.Error())
	}
}

func (w *world) jitter(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

func (w *world) logf(format string, args ...any) {
	// The wall clock too: the invariant monitor reports its findings
	// (confirmed_flush_lsn moving backwards, say) by wall-clock time.
	now := time.Now()
	line := fmt.Sprintf("%7.1fs %s  ", now.Sub(w.started).Seconds(), now.Format("15:04:05.0")) + fmt.Sprintf(format, args...)
	w.faultLog = append(w.faultLog, line)
	if testing.Verbose() {
		fmt.Println("fault:", line)
	}
}

// inject runs one fault to completion (the system is healthy again, as far
// as the injector is concerned, when it returns).
func (w *world) inject(kind faultKind) error {
	w.checkRelay()
	start := time.Now()
	w.faultEvents = append(w.faultEvents, faultEvent{kind: kind, start: start})
	var detail string
	var err error
	switch kind {
	case faultKill, faultKillUnderLag:
		if kind == faultKillUnderLag {
			// Wait (bounded) for a burst: unconfirmed WAL beyond 32 KiB.
			deadline := time.Now().Add(20 * time.Second)
			for w.mon.lag() < 32<<10 && time.Now().Before(deadline) {
				sleepCtx(w.ctx, 5*time.Millisecond)
			}
			detail = fmt.Sprintf("lag %s, ", fmtBytes(w.mon.lag()))
			w.faultEvents[len(w.faultEvents)-1].start = time.Now()
		}
		err = w.killRelay()
		pause := w.jitter(0, time.Second)
		sleepCtx(w.ctx, pause)
		if err == nil {
			err = w.startRelay()
		}
		detail += fmt.Sprintf("restart after %v", pause.Round(time.Millisecond))
	case faultKillBrokerDown:
		if err = w.kafka.Stop(); err != nil {
			break
		}
		sleepCtx(w.ctx, w.jitter(200*time.Millisecond, time.Second))
		if err = w.killRelay(); err != nil {
			break
		}
		// outboxd must start streaming while Kafka is unreachable.
		err = w.startRelay()
		sleepCtx(w.ctx, w.jitter(500*time.Millisecond, 2*time.Second))
		if e := w.kafka.Start(w.ctx); err == nil {
			err = e
		}
	case faultTerm, faultTermBrokerStall:
		if kind == faultTermBrokerStall {
			if err = w.kafka.Pause(); err != nil {
				break
			}
			sleepCtx(w.ctx, w.jitter(200*time.Millisecond, time.Second))
		}
		var took time.Duration
		took, err = w.termRelay()
		detail = fmt.Sprintf("exited after %v", took.Round(time.Millisecond))
		if kind == faultTermBrokerStall {
			if e := w.kafka.Resume(); err == nil {
				err = e
			}
		}
		if e := w.startRelay(); err == nil {
			err = e
		}
	case faultBrokerStop:
		if err = w.kafka.Stop(); err != nil {
			break
		}
		down := w.jitter(time.Second, 4*time.Second)
		sleepCtx(w.ctx, down)
		err = w.kafka.Start(w.ctx)
		detail = fmt.Sprintf("down %v", down.Round(time.Millisecond))
	case faultBrokerStall, faultBrokerLongStall:
		if err = w.kafka.Pause(); err != nil {
			break
		}
		d := w.jitter(time.Second, 5*time.Second)
		if kind == faultBrokerLongStall {
			d = w.jitter(22*time.Second, 30*time.Second) // kgo: 10s produce timeout + 10s overhead
		}
		sleepCtx(w.ctx, d)
		err = w.kafka.Resume()
		detail = fmt.Sprintf("stalled %v", d.Round(time.Millisecond))
	case faultPGRestart, faultPGCrash:
		how := "fast"
		if kind == faultPGCrash {
			how = "immediate"
		}
		ctx, cancel := context.WithTimeout(w.ctx, 3*time.Minute)
		rs := time.Now()
		err = w.pg.Restart(ctx, how)
		cancel()
		detail = fmt.Sprintf("restart took %v", time.Since(rs).Round(time.Millisecond))
	case faultPGRestartBrokerDown:
		if err = w.kafka.Stop(); err != nil {
			break
		}
		sleepCtx(w.ctx, w.jitter(500*time.Millisecond, 1500*time.Millisecond))
		ctx, cancel := context.WithTimeout(w.ctx, pgRestartBound)
		rs := time.Now()
		err = w.pg.Restart(ctx, "fast")
		cancel()
		took := time.Since(rs)
		detail = fmt.Sprintf("restart took %v", took.Round(time.Millisecond))
		if err != nil {
			err = fmt.Errorf("PostgreSQL fast restart did not finish within %v while Kafka was down: %w", pgRestartBound, err)
		}
		if e := w.kafka.Start(w.ctx); err == nil {
			err = e
		}
		// Recover: with Kafka back, the shutdown completes; start again.
		ctx, cancel = context.WithTimeout(w.ctx, 3*time.Minute)
		if e := w.pg.Stop(ctx); e != nil {
			w.errs = append(w.errs, e.Error())
		}
		if e := w.pg.Start(ctx); e != nil {
			w.errs = append(w.errs, e.Error())
		}
		cancel()
	case faultWalsenderKill:
		var pid int
		pid, err = w.terminateWalsender()
		detail = fmt.Sprintf("walsender pid %d", pid)
	case faultPGProxyCut, faultKafkaCut:
		p := w.proxyFor(kind)
		d := w.jitter(500*time.Millisecond, 3*time.Second)
		p.Cut(d)
		sleepCtx(w.ctx, d)
		detail = fmt.Sprintf("refusing for %v", d.Round(time.Millisecond))
	case faultPGProxyStall, faultKafkaStall:
		p := w.proxyFor(kind)
		d := w.jitter(time.Second, 5*time.Second)
		p.Stall()
		sleepCtx(w.ctx, d)
		p.Pass()
		detail = fmt.Sprintf("stalled %v", d.Round(time.Millisecond))
	case faultPGProxyDelay, faultKafkaDelay:
		p := w.proxyFor(kind)
		lat := w.jitter(20*time.Millisecond, 150*time.Millisecond)
		d := w.jitter(2*time.Second, 6*time.Second)
		p.Delay(lat)
		sleepCtx(w.ctx, d)
		p.Pass()
		detail = fmt.Sprintf("+%v for %v", lat.Round(time.Millisecond), d.Round(time.Millisecond))
	case faultLeaderKill, faultNodeStall, faultControllerKill, faultRollingRestart, faultTwoDown, faultTxnCoordKill:
		detail, err = w.clusterFault(kind)
	case faultPGBlackhole, faultKafkaBlackhole:
		w.proxyFor(kind).Blackhole()
		// Let the load write on, so that settling needs the relay to
		// notice the dead connection and deliver through a new one.
		sleepCtx(w.ctx, 2*time.Second)
	case faultHAKill, faultHAStop:
		detail, err = w.injectHA(kind)
	case faultBrokerRefused, faultTopicRefuses:
		detail, err = w.injectRefusal(kind)
	default:
		err = fmt.Errorf("unknown fault %q", kind)
	}
	w.faultsDone[kind]++
	took := time.Since(start)
	if err != nil {
		w.faultEvents[len(w.faultEvents)-1].settled = time.Now()
		w.logf("%-18s %-28s took %v", kind, detail, took.Round(time.Millisecond))
		return fmt.Errorf("fault %s: %w", kind, err)
	}
	settle, serr := w.settle()
	w.faultEvents[len(w.faultEvents)-1].settled = time.Now()
	w.logf("%-18s %-34s took %v, settled in %v", kind, detail, took.Round(time.Millisecond), settle.Round(time.Millisecond))
	if serr != nil {
		return fmt.Errorf("after fault %s: %w", kind, serr)
	}
	return nil
}

// settle waits until outboxd confirmed everything written before the fault
// ended: every fault must be recovered from, within settleBound.
func (w *world) settle() (time.Duration, error) {
	start := time.Now()
	bound := w.sc.settleBound
	if bound <= 0 {
		bound = time.Minute
	}
	ctx, cancel := context.WithTimeout(w.ctx, bound)
	defer cancel()
	var target uint64
	for {
		conn, err := pgx.Connect(ctx, w.dsn)
		if err == nil {
			target, err = harness.CurrentWALLSN(ctx, conn)
			conn.Close(context.Background())
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return time.Since(start), fmt.Errorf("reading the WAL position: %w", err)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	for {
		w.checkRelay()
		if c, _ := w.mon.latestC(); c >= target {
			return time.Since(start), nil
		}
		if ctx.Err() != nil {
			c, _ := w.mon.latestC()
			return time.Since(start), fmt.Errorf("outboxd did not recover within %v: confirmed_flush_lsn %s, WAL was at %s when the fault ended",
				bound, harness.FormatLSN(c), harness.FormatLSN(target))
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

func (w *world) proxyFor(kind faultKind) proxyFaults {
	if strings.HasPrefix(string(kind), "pg-") {
		return w.pgProxy
	}
	return w.kafkaProxies
}

func (w *world) killRelay() error {
	w.relayMu.Lock()
	p := w.relay
	w.relayMu.Unlock()
	if p == nil {
		return nil
	}
	if p.Exited() {
		w.checkRelay()
		w.relayMu.Lock()
		p = w.relay
		w.relayMu.Unlock()
	}
	return p.Kill()
}

// relayShutdownTimeout is outboxd's --shutdown-timeout; SIGTERM must end
// the process within it plus termSlack.
const (
	relayShutdownTimeout = 10 * time.Second
	termSlack            = 10 * time.Second
)

// termRelay sends SIGTERM and expects exit code 0 in time.
func (w *world) termRelay() (time.Duration, error) {
	w.relayMu.Lock()
	p := w.relay
	w.relayMu.Unlock()
	if p.Exited() {
		w.checkRelay()
		w.relayMu.Lock()
		p = w.relay
		w.relayMu.Unlock()
	}
	start := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(w.ctx, relayShutdownTimeout+termSlack)
	code, err := p.Wait(ctx)
	cancel()
	took := time.Since(start)
	if err != nil {
		_ = p.Kill()
		return took, fmt.Errorf("outboxd did not exit within %v of SIGTERM (--shutdown-timeout %v): %w", relayShutdownTimeout+termSlack, relayShutdownTimeout, err)
	}
	if code != 0 {
		return took, fmt.Errorf("outboxd exited with code %d on SIGTERM; log tail:\n%s", code, tailString(p.Log(), 2000))
	}
	return took, nil
}

// terminateWalsender ends the slot's walsender, waiting (bounded) for one
// to be active.
func (w *world) terminateWalsender() (int, error) {
	ctx, cancel := context.WithTimeout(w.ctx, 20*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, w.dsn)
		if err == nil {
			var pid *int32
			err = conn.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slotName).Scan(&pid)
			if err == nil && pid != nil {
				var ok bool
				err = conn.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, *pid).Scan(&ok)
				if err == nil && ok {
					conn.Close(context.Background())
					return int(*pid), nil
				}
			}
			conn.Close(context.Background())
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("no walsender to terminate: %w (last error %v)", ctx.Err(), err)
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// outcome of a run, for the summary.
type runResult struct {
	rep      *report
	wall     time.Duration
	loadTime time.Duration
	catchUp  time.Duration
	monitor  string
	maxLag   uint64
	maxLagAt time.Time
	kills    int
	exitCode int
	failures []string
}

// run drives the scenario and checks the outcome; it fails the test on any
// violated expectation and logs a summary either way.
func (w *world) run() *runResult {
	t := w.t
	res := &runResult{}
	w.mon.start(w.ctx)
	if err := w.startRelay(); err != nil {
		t.Fatal(err)
	}
	if w.sc.standby {
		if err := w.startStandby(); err != nil {
			t.Fatal(err)
		}
	}
	loadStart := time.Now()
	w.load.start(w.ctx)
	w.logf("load started (%d writers), %d faults over %v", w.sc.load.writers, len(w.sc.faults), w.sc.spread)

	sleepCtx(w.ctx, w.sc.warmup)
	slot := w.sc.spread / time.Duration(max(1, len(w.sc.faults)))
	base := time.Now()
	for i, f := range w.sc.faults {
		// A random moment within the fault's slot.
		target := base.Add(time.Duration(i)*slot + w.jitter(0, slot/2))
		sleepCtx(w.ctx, time.Until(target))
		if err := w.inject(f); err != nil {
			w.errs = append(w.errs, err.Error())
			w.logf("ERROR %v", err)
			if w.kafka.Exited() || errorsFatal(err) {
				break
			}
		}
	}
	sleepCtx(w.ctx, w.sc.cooldown)
	w.checkRelay()
	w.load.stop()
	res.loadTime = time.Since(loadStart)
	w.logf("load stopped")

	txns, events := w.load.snapshot()
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	committed, problems, err := resolveCommits(ctx, conn, w.startLSN, txns)
	conn.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	target := maxCommitEnd(committed)

	// Everything committed must be confirmed within catchUp.
	catchStart := time.Now()
	for {
		w.checkRelay()
		c, _ := w.mon.latestC()
		if c >= target {
			break
		}
		if time.Since(catchStart) > w.sc.catchUp {
			w.errs = append(w.errs, fmt.Sprintf("slot did not catch up within %v: confirmed_flush_lsn %s, last commit ends at %s",
				w.sc.catchUp, harness.FormatLSN(c), harness.FormatLSN(target)))
			break
		}
		sleepCtx(w.ctx, 50*time.Millisecond)
	}
	res.catchUp = time.Since(catchStart)
	sleepCtx(w.ctx, 300*time.Millisecond) // a few more monitor pairs past the end
	w.mon.stop()
	w.logf("slot caught up in %v", res.catchUp.Round(time.Millisecond))

	// A clean stop must work after all this.
	if _, err := w.termRelay(); err != nil {
		w.errs = append(w.errs, "final stop: "+err.Error())
		res.exitCode = -1
	}
	w.stopStandby()

	rctx, rcancel := context.WithTimeout(w.ctx, 2*time.Minute)
	recs, _, err := readTopics(rctx, w.kafkaOpts(), w.topics, partitions, w.mode)
	rcancel()
	if err != nil {
		w.errs = append(w.errs, err.Error())
	}
	if w.mode.readCommitted() {
		sctx, scancel := context.WithTimeout(w.ctx, 30*time.Second)
		for _, l := range stuckTransactions(sctx, w.kafkaOpts(), w.topics) {
			w.logf("read_committed stops short: %s", l)
		}
		scancel()
	}
	pairs, _, _ := w.mon.pairs()
	rep := check(txns, committed, events, recs, w.topics, partitions, pairs)
	rep.problems = append(problems, rep.problems...)
	res.rep = rep
	res.monitor = w.mon.String()
	res.maxLag, res.maxLagAt = w.mon.maxLag, w.mon.maxLagAt
	res.kills = w.faultsDone[faultKill] + w.faultsDone[faultKillUnderLag] + w.faultsDone[faultKillBrokerDown]
	res.wall = time.Since(w.started)
	res.failures = append(res.failures, rep.failures(w.mode)...)
	res.failures = append(res.failures, w.errs...)
	res.failures = append(res.failures, w.unexpectedExits...)

	t.Log(w.summary(res))
	w.writeResults(res) // results_test.go
	for _, f := range res.failures {
		t.Error(f)
	}
	return res
}

// errorsFatal: injection errors after which going on makes no sense.
func errorsFatal(err error) bool {
	return strings.Contains(err.Error(), "pg_ctl") || strings.Contains(err.Error(), "starting broker")
}

func (w *world) summary(res *runResult) string {
	rep := res.rep
	var b strings.Builder
	fmt.Fprintf(&b, "\n=== fault summary: scenario %s, mode %s, seed %d ===\n", w.sc.name, w.mode.name, w.seed)
	fmt.Fprintf(&b, "  wall time       %v (load %v, catch-up after load %v)\n", res.wall.Round(100*time.Millisecond), res.loadTime.Round(100*time.Millisecond), res.catchUp.Round(10*time.Millisecond))
	fmt.Fprintf(&b, "  transactions    %d planned: %d committed (%d insert+delete, %d with unknown COMMIT result resolved as committed), %d rolled back, %d failed/not committed (%d unknown results in all)\n",
		rep.txnsPlanned, rep.txnsCommitted, rep.insertDeleteCommitted, rep.txnsUnknownCommitted, rep.txnsRolledBack, rep.txnsFailed, rep.txnsUnknown)
	fmt.Fprintf(&b, "  events          %d committed, %d not committed; Kafka holds %d records, %d distinct ids\n",
		rep.eventsCommitted, rep.eventsNotCommitted, rep.records, rep.distinct)
	var kinds []string
	total := 0
	for k, n := range w.faultsDone {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	fmt.Fprintf(&b, "  faults          %d: %s\n", total, strings.Join(kinds, " "))
	fmt.Fprintf(&b, "  outboxd         %d starts, %d SIGKILLs, %d unexpected exits, final SIGTERM exit code %d\n", w.relayStarts, res.kills, len(w.unexpectedExits), res.exitCode)
	fmt.Fprintf(&b, "  lost            %d\n", len(rep.lost))
	perKill := 0.0
	if res.kills > 0 {
		perKill = float64(rep.duplicates) / float64(res.kills)
	}
	fmt.Fprintf(&b, "  duplicates      %d (%.1f per SIGKILL on average); by re-sending producer id: %s\n", rep.duplicates, perKill, dupsByProducer(rep.dupsByProducer))
	fmt.Fprintf(&b, "  dups by fault   %s\n", w.dupsByFault(rep))
	fmt.Fprintf(&b, "  max slot lag    %s (at %s)\n", fmtBytes(res.maxLag), res.maxLagAt.Format("15:04:05.000"))
	fmt.Fprintf(&b, "  monitor         %s; %d (C, end offsets) pairs checked, %d violations\n", res.monitor, rep.pairs, rep.violations)
	pga, pgr := w.pgProxy.Stats()
	ka, kr := w.kafkaProxies.Stats()
	fmt.Fprintf(&b, "  proxies         pg: %d connections, %d refused; kafka: %d connections, %d refused; writer reconnects %d\n", pga, pgr, ka, kr, w.load.reconnects.Load())
	if len(res.failures) == 0 {
		fmt.Fprintf(&b, "  verdict         PASS\n")
	} else {
		fmt.Fprintf(&b, "  verdict         FAIL (%d problems)\n", len(res.failures))
	}
	fmt.Fprintf(&b, "  timeline:\n")
	for _, l := range w.faultLog {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	return b.String()
}

// dupsByFault attributes each duplicate to the fault whose window (from
// its disruptive action until it settled) holds the duplicate's append
// time, bounded by the first monitor snapshot whose end offset passed it.
func (w *world) dupsByFault(rep *report) string {
	if len(rep.dupRecs) == 0 {
		return "none"
	}
	counts, outside, unknown := w.attributeDups(rep)
	var parts, perKill []string
	for i, f := range w.faultEvents {
		if f.kind == faultKill || f.kind == faultKillUnderLag || f.kind == faultKillBrokerDown {
			perKill = append(perKill, fmt.Sprint(counts[i]))
		}
		if counts[i] > 0 {
			parts = append(parts, fmt.Sprintf("%s@%.1fs:%d", f.kind, f.start.Sub(w.started).Seconds(), counts[i]))
		}
	}
	s := strings.Join(parts, " ")
	if outside > 0 {
		s += fmt.Sprintf(" outside-any-fault:%d", outside)
	}
	if unknown > 0 {
		s += fmt.Sprintf(" unattributed:%d", unknown)
	}
	if len(perKill) > 0 {
		s += "\n  dups per kill   " + strings.Join(perKill, " ")
	}
	return s
}

// attributeDups counts the duplicates appended in each fault's window
// (w.faultEvents' order); outside: in none, unknown: in no monitor snapshot.
func (w *world) attributeDups(rep *report) (counts []int, outside, unknown int) {
	const slack = 200 * time.Millisecond // monitor snapshot granularity
	counts = make([]int, len(w.faultEvents))
	for _, d := range rep.dupRecs {
		at := w.mon.appendedBy(d.pi, d.offset)
		if at.IsZero() {
			unknown++
			continue
		}
		i := sort.Search(len(w.faultEvents), func(i int) bool { return w.faultEvents[i].start.After(at) }) - 1
		if i < 0 || at.After(w.faultEvents[i].settled.Add(slack)) {
			outside++
			continue
		}
		counts[i]++
	}
	return counts, outside, unknown
}

// dupsByKind sums attributeDups by fault kind, for the results file:
// "kill=547 pg-restart=2804 …" (kinds with none left out), then
// outside-any-fault and unattributed when there are such; "none" if no
// duplicate.
func (w *world) dupsByKind(rep *report) string {
	if len(rep.dupRecs) == 0 {
		return "none"
	}
	counts, outside, unknown := w.attributeDups(rep)
	byKind := map[faultKind]int{}
	for i, f := range w.faultEvents {
		byKind[f.kind] += counts[i]
	}
	var parts []string
	for k, n := range byKind {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, n))
		}
	}
	sort.Strings(parts)
	if outside > 0 {
		parts = append(parts, fmt.Sprintf("outside-any-fault=%d", outside))
	}
	if unknown > 0 {
		parts = append(parts, fmt.Sprintf("unattributed=%d", unknown))
	}
	return strings.Join(parts, " ")
}

func dupsByProducer(m map[int64]int) string {
	if len(m) == 0 {
		return "none"
	}
	var ids []int64
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("%d:%d", id, m[id]))
	}
	return strings.Join(parts, " ")
}

func fmtBytes(n uint64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func fileTail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}
