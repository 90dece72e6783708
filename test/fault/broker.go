package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxd/outboxd/test/harness"
)

// Why not harness.Kafka (test/cmd/kfaked)? A proxy in front of a broker only
// sees the bootstrap connection: kfake fills Metadata (and FindCoordinator,
// produce/fetch leader hints) with b.ln.Addr(), its own listener address, so
// clients then dial the broker directly and produce traffic bypasses the
// proxy. kfake has no "advertised listeners" option, but it has ListenFn:
// the broker below listens on its own fixed port and wraps the listener so
// that Addr() reports the proxy's address. Every client that bootstraps
// anywhere is then sent to the proxy for all real traffic. The test's own
// clients (monitor, checker) dial through a kgo.Dialer that maps the proxy
// address back to the broker port, so Kafka-side network faults only hit
// outboxd.
//
// The broker is the test binary itself, re-executed with BrokerEnv set
// (TestMain calls RunBrokerIfChild first); it is a separate process, so it
// can be stopped (SIGTERM, kfake persists to its data dir), killed, or
// frozen with SIGSTOP like kfaked.

// BrokerEnv carries the child broker's JSON config.
const BrokerEnv = "OUTBOXD_FAULT_BROKER"

type brokerConfig struct {
	Port       int    `json:"port"`
	Advertise  string `json:"advertise"`
	DataDir    string `json:"data_dir"`
	Partitions int    `json:"partitions"`
}

const brokerReady = "fault broker listening on "

// RunBrokerIfChild runs the broker and exits if this process was started
// as one (BrokerEnv set); otherwise it returns at once.
func RunBrokerIfChild() {
	raw := os.Getenv(BrokerEnv)
	if raw == "" {
		return
	}
	var cfg brokerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "fault broker:", err)
		os.Exit(2)
	}
	if err := runBroker(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "fault broker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runBroker(cfg brokerConfig) error {
	adv, err := net.ResolveTCPAddr("tcp", cfg.Advertise)
	if err != nil {
		return fmt.Errorf("advertised address: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cluster, err := kfake.NewCluster(
		kfake.Ports(cfg.Port),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			ln, err := net.Listen(network, addr)
			if err != nil {
				return nil, err
			}
			return advertisedListener{ln, adv}, nil
		}),
		kfake.DataDir(cfg.DataDir),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(cfg.Partitions),
		// Its warnings (a slow EndTxn, a transaction aborted on restart,
		// a malformed batch) go to broker.log, kept by -keep-logs.
		kfake.WithLogger(kfake.BasicLogger(os.Stderr, kfake.LogLevelWarn)),
	)
	if err != nil {
		return fmt.Errorf("starting cluster: %w", err)
	}
	fmt.Printf("%s127.0.0.1:%d advertising %s\n", brokerReady, cfg.Port, cluster.ListenAddrs()[0])
	<-ctx.Done()
	cluster.Close() // persists state to the data dir
	fmt.Fprintln(os.Stderr, "fault broker stopped")
	return nil
}

// advertisedListener reports a different address than it listens on.
type advertisedListener struct {
	net.Listener
	adv net.Addr
}

func (l advertisedListener) Addr() net.Addr { return l.adv }

// Broker is a kfake broker process that advertises a proxy's address.
type Broker struct {
	mu         sync.Mutex
	bin        string
	dir        string
	port       int
	advertise  string
	partitions int
	proc       *harness.Proc
	paused     bool
}

// StartBroker starts a broker advertising advertise (a proxy's address that
// forwards to Addr()). The broker keeps its port and data across restarts.
func StartBroker(ctx context.Context, advertise string, partitions int, logDir string) (*Broker, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(logDir, "kafka")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	b := &Broker{bin: bin, dir: dir, advertise: advertise, partitions: partitions}
	for attempt := 1; ; attempt++ {
		if b.port, err = harness.FreePort(); err == nil {
			err = b.start(ctx)
		}
		if err == nil {
			return b, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
}

func (b *Broker) start(ctx context.Context) error {
	cfg, _ := json.Marshal(brokerConfig{Port: b.port, Advertise: b.advertise, DataDir: filepath.Join(b.dir, "data"), Partitions: b.partitions})
	proc, err := harness.StartProc(ctx, "broker", b.bin, []string{"-test.run=^$"}, []string{BrokerEnv + "=" + string(cfg)}, b.dir)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := proc.WaitLog(wctx, brokerReady); err != nil {
		_ = proc.Kill()
		return fmt.Errorf("starting broker: %w", err)
	}
	b.proc, b.paused = proc, false
	return nil
}

// Addr is the broker's own address (not the advertised one).
func (b *Broker) Addr() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

// Advertised is the address the broker sends clients to.
func (b *Broker) Advertised() string { return b.advertise }

// LogFile is the broker's output.
func (b *Broker) LogFile() string { return filepath.Join(b.dir, "broker.log") }

// Start restarts a stopped broker (same port, same data); no-op if running.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc != nil && !b.proc.Exited() {
		return nil
	}
	return b.start(ctx)
}

// Stop shuts the broker down cleanly (SIGTERM; kfake persists its state).
func (b *Broker) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return nil
	}
	proc := b.proc
	b.proc = nil
	if b.paused {
		_ = proc.Signal(syscall.SIGCONT)
		b.paused = false
	}
	return proc.Stop(time.Minute)
}

// Pause freezes the broker process (SIGSTOP): connections stay open and
// nothing is answered.
func (b *Broker) Pause() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil || b.paused {
		return nil
	}
	b.paused = true
	return b.proc.Freeze()
}

// Resume undoes Pause (SIGCONT).
func (b *Broker) Resume() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil || !b.paused {
		return nil
	}
	b.paused = false
	return b.proc.Signal(syscall.SIGCONT)
}

// Close stops the broker (killing it if a clean stop fails).
func (b *Broker) Close() {
	if err := b.Stop(); err != nil {
		b.mu.Lock()
		if b.proc != nil {
			_ = b.proc.Kill()
		}
		b.mu.Unlock()
	}
}

// Exited reports whether a started broker died by itself.
func (b *Broker) Exited() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.proc != nil && b.proc.Exited()
}

// DialRedirect returns a dial function that sends connections for the
// advertised (proxy) address straight to the broker.
func (b *Broker) DialRedirect() func(ctx context.Context, network, host string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		if host == b.advertise {
			host = b.Addr()
		}
		return d.DialContext(ctx, network, host)
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return strings.TrimRight(s, "\n")
}
