package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// EnvKafka names the environment variable holding comma-separated brokers
// of an existing Kafka cluster to use instead of starting one.
const EnvKafka = "OUTBOXD_TEST_KAFKA"

// EnvKafkaKind picks the broker the harness starts: KindKfake (default),
// KindApache or KindApacheCluster. EnvKafka, when set, wins.
const EnvKafkaKind = "OUTBOXD_TEST_KAFKA_KIND"

// Broker kinds (EnvKafkaKind).
const (
	KindKfake         = "kfake"          // test/cmd/kfaked: franz-go's kfake in a child process; fast
	KindApache        = "apache"         // Apache Kafka, one KRaft node (broker+controller)
	KindApacheCluster = "apache-cluster" // Apache Kafka, three KRaft nodes (3-voter quorum, RF 3, min ISR 2)
	KindExternal      = "external"       // EnvKafka
)

// KafkaOption customizes a harness-started broker.
type KafkaOption func(*kafkaOptions)

type kafkaOptions struct {
	saslMech, saslUser, saslPass string
	certFile, keyFile            string
	partitions                   int
	advertise                    []string // Apache: per-node advertised client address
	noAutoCreate                 bool
	aclUser, aclPass             string // Apache: a second SASL user subject to ACLs
	trustCA, serverName          string // harness clients: the CA and name to verify (default certFile, the dialed host)
	clientCA                     string // the broker requires client certificates signed by it
	clientCert, clientKey        string // what harness clients present to a clientCA broker
}

// WithTLSTrust makes harness clients verify the WithTLS certificate against
// caFile for serverName ("" is the dialed host) instead of trusting the
// certificate itself: for certificates issued by a TestCA.
func WithTLSTrust(caFile, serverName string) KafkaOption {
	return func(o *kafkaOptions) { o.trustCA, o.serverName = caFile, serverName }
}

// WithClientAuth (with WithTLS) makes the broker require a client
// certificate signed by caFile (mutual TLS); harness clients present
// certFile and keyFile.
func WithClientAuth(caFile, certFile, keyFile string) KafkaOption {
	return func(o *kafkaOptions) { o.clientCA, o.clientCert, o.clientKey = caFile, certFile, keyFile }
}

// WithACLUser (Apache only, with WithSASL) turns on Kafka's StandardAuthorizer
// and adds a second SASL user who may do only what ACLs grant; the WithSASL
// user stays a superuser, and ClientOpts authenticate as it.
func WithACLUser(user, pass string) KafkaOption {
	return func(o *kafkaOptions) { o.aclUser, o.aclPass = user, pass }
}

// WithoutAutoCreate turns off topic auto-creation on kfake, as it is on
// production brokers and on every Apache Kafka the harness starts.
func WithoutAutoCreate() KafkaOption {
	return func(o *kafkaOptions) { o.noAutoCreate = true }
}

// WithSASL requires SASL authentication (PLAIN, SCRAM-SHA-256 or
// SCRAM-SHA-512) with user/pass as the only (super)user.
func WithSASL(mechanism, user, pass string) KafkaOption {
	return func(o *kafkaOptions) { o.saslMech, o.saslUser, o.saslPass = mechanism, user, pass }
}

// WithTLS serves TLS with the given PEM certificate and key files.
func WithTLS(certFile, keyFile string) KafkaOption {
	return func(o *kafkaOptions) { o.certFile, o.keyFile = certFile, keyFile }
}

// WithPartitions sets the partition count of auto-created topics (kfake) or
// the broker's num.partitions (Apache); default 3.
func WithPartitions(n int) KafkaOption {
	return func(o *kafkaOptions) { o.partitions = n }
}

// kafkaBackend is what every kind of broker offers the tests.
type kafkaBackend interface {
	Brokers() []string
	External() bool
	LogFile() string
	ClientOpts() ([]kgo.Opt, error)
	Start(ctx context.Context) error // restart what was stopped or killed
	Stop() error                     // clean stop of every broker
	Kill() error                     // SIGKILL every broker
	Pause() error                    // SIGSTOP every broker
	Resume() error
	Close()
}

// Kafka is the broker of a test, whatever its kind (see EnvKafkaKind):
// kfake, Apache Kafka (one node or three) or an external cluster. Stop,
// Start, Kill, Pause and Resume act on every broker; Apache gives the
// per-node controls of an Apache cluster.
type Kafka struct {
	kafkaBackend
	kind   string
	apache *ApacheKafka
}

// Kind is the broker kind (KindKfake, KindApache, ...).
func (k *Kafka) Kind() string { return k.kind }

// Apache returns the Apache cluster behind k, nil for other kinds.
func (k *Kafka) Apache() *ApacheKafka { return k.apache }

// KafkaKind is the kind StartKafka starts, from the environment.
func KafkaKind() (string, error) {
	if os.Getenv(EnvKafka) != "" {
		return KindExternal, nil
	}
	switch kind := os.Getenv(EnvKafkaKind); kind {
	case "", KindKfake:
		return KindKfake, nil
	case KindApache, KindApacheCluster:
		return kind, nil
	default:
		return "", fmt.Errorf("%s=%q: want %s, %s or %s", EnvKafkaKind, kind, KindKfake, KindApache, KindApacheCluster)
	}
}

// StartKafka starts a broker of the kind the environment picks (see
// EnvKafkaKind; kfaked is built once per process), or uses the brokers
// named by OUTBOXD_TEST_KAFKA. Close it when done.
func StartKafka(ctx context.Context, opts ...KafkaOption) (*Kafka, error) {
	kind, err := KafkaKind()
	if err != nil {
		return nil, err
	}
	return StartKafkaKind(ctx, kind, opts...)
}

// StartKafkaKind starts a broker of the given kind.
func StartKafkaKind(ctx context.Context, kind string, opts ...KafkaOption) (*Kafka, error) {
	switch kind {
	case KindApache, KindApacheCluster:
		n := 1
		if kind == KindApacheCluster {
			n = 3
		}
		c, err := StartApacheKafka(ctx, n, opts...)
		if err != nil {
			return nil, err
		}
		return &Kafka{kafkaBackend: c, kind: kind, apache: c}, nil
	case KindKfake, KindExternal:
		k, err := startKfake(ctx, kind == KindExternal, opts...)
		if err != nil {
			return nil, err
		}
		return &Kafka{kafkaBackend: k, kind: kind}, nil
	}
	return nil, fmt.Errorf("unknown kafka kind %q", kind)
}

// kfakeKafka is a single fake broker (test/cmd/kfaked) running as a child
// process with its data in a temp dir, or an external cluster (EnvKafka).
type kfakeKafka struct {
	mu      sync.Mutex
	opts    kafkaOptions
	brokers []string
	extern  bool

	bin  string
	dir  string // temp dir: data dir and broker log
	port int
	proc *Proc // nil while stopped

	ctr *testContainer // the broker's container (EnvBackend docker), see dockerkafka.go
}

func startKfake(ctx context.Context, extern bool, opts ...KafkaOption) (*kfakeKafka, error) {
	k := &kfakeKafka{opts: kafkaOptions{partitions: 3}}
	for _, opt := range opts {
		opt(&k.opts)
	}
	if extern {
		k.extern = true
		for _, b := range strings.Split(os.Getenv(EnvKafka), ",") {
			if b = strings.TrimSpace(b); b != "" {
				k.brokers = append(k.brokers, b)
			}
		}
		return k, nil
	}
	if kd, ok, err := k.startDocker(ctx); ok {
		return kd, err
	}
	bin, err := BuildBinary(ctx, "./test/cmd/kfaked")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outboxd-kafka-")
	if err != nil {
		return nil, fmt.Errorf("creating kafka temp dir: %w", err)
	}
	k.bin, k.dir = bin, dir
	if err := onFreePort(ctx, &k.port, func() error { return k.start(ctx) }, nil); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return k, nil
}

// KafkaForTest starts a broker (see StartKafka) that is closed when the
// test finishes. On failure the broker log tail is added to the test output.
func KafkaForTest(t testing.TB, opts ...KafkaOption) *Kafka {
	t.Helper()
	return serverForTest(t, "kafka", 5*time.Minute, func(ctx context.Context) (*Kafka, error) { return StartKafka(ctx, opts...) },
		func(k *Kafka) {
			if !k.External() {
				if k.apache != nil {
					k.apache.logTails(t)
				} else {
					t.Logf("kfaked log tail (%s):\n%s", k.LogFile(), fileTail(k.LogFile(), 8<<10))
				}
			}
		})
}

func (k *kfakeKafka) start(ctx context.Context) error {
	args := []string{
		"-port", strconv.Itoa(k.port),
		"-data-dir", filepath.Join(k.dir, "data"),
		"-partitions", strconv.Itoa(k.opts.partitions),
	}
	if k.opts.noAutoCreate {
		args = append(args, "-auto-create=false")
	}
	if k.opts.saslUser != "" {
		args = append(args, "-sasl-mechanism", k.opts.saslMech, "-sasl-user", k.opts.saslUser, "-sasl-pass", k.opts.saslPass)
	}
	if k.opts.certFile != "" {
		args = append(args, "-tls-cert", k.opts.certFile, "-tls-key", k.opts.keyFile)
	}
	if k.opts.clientCA != "" {
		args = append(args, "-tls-client-ca", k.opts.clientCA)
	}
	proc, err := StartProc(ctx, "kfaked", k.bin, args, nil, k.dir)
	if err != nil {
		return err
	}
	if err := proc.WaitLog(ctx, "kfaked listening on "); err != nil {
		_ = proc.Kill()
		return fmt.Errorf("starting kfaked: %w", err)
	}
	addr, err := listenAddr(proc.Log())
	if err != nil {
		_ = proc.Kill()
		return err
	}
	k.proc = proc
	k.brokers = []string{addr}
	return nil
}

// listenAddr extracts the address from kfaked's "listening" line.
func listenAddr(log string) (string, error) {
	const prefix = "kfaked listening on "
	_, rest, ok := strings.Cut(log, prefix)
	addr, _, complete := strings.Cut(rest, "\n")
	if !ok || !complete || addr == "" {
		return "", fmt.Errorf("starting kfaked: no address in output %q", log)
	}
	return addr, nil
}

// Brokers returns the seed brokers, e.g. ["127.0.0.1:PORT"].
func (k *kfakeKafka) Brokers() []string { return append([]string(nil), k.brokers...) }

// External reports whether the brokers came from OUTBOXD_TEST_KAFKA.
func (k *kfakeKafka) External() bool { return k.extern }

// LogFile is the broker's output ("" for an external cluster).
func (k *kfakeKafka) LogFile() string {
	if k.extern {
		return ""
	}
	if k.ctr != nil {
		return k.dockerLogFile()
	}
	return filepath.Join(k.dir, "kfaked.log")
}

func (k *kfakeKafka) errExternal(op string) error {
	return fmt.Errorf("kafka %s: not supported against an external cluster (%s)", op, EnvKafka)
}

// Start restarts a stopped or killed broker on the same port with the same
// data dir; it is a no-op when running.
func (k *kfakeKafka) Start(ctx context.Context) error {
	if k.extern {
		return k.errExternal("start")
	}
	if k.ctr != nil {
		return k.dockerStart(ctx)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.proc != nil && !k.proc.Exited() {
		return nil
	}
	k.proc = nil
	return k.start(ctx)
}

// Stop shuts the broker down cleanly (SIGTERM, kfake persists its state)
// and waits for it to exit. Stopping a stopped broker is a no-op.
func (k *kfakeKafka) Stop() error {
	if k.extern {
		return k.errExternal("stop")
	}
	if k.ctr != nil {
		return k.dockerStop()
	}
	return haltProc(&k.mu, &k.proc, func(p *Proc) error { return p.Stop(time.Minute) })
}

// Pause freezes the broker (SIGSTOP) and returns once all its threads are
// stopped: connections stay open, nothing more is answered. Resume undoes
// it.
func (k *kfakeKafka) Pause() error { return k.signal(syscall.SIGSTOP, "pause") }

// Resume continues a paused broker (SIGCONT).
func (k *kfakeKafka) Resume() error { return k.signal(syscall.SIGCONT, "resume") }

func (k *kfakeKafka) signal(sig syscall.Signal, op string) error {
	if k.extern {
		return k.errExternal(op)
	}
	if k.ctr != nil {
		return k.dockerPause(sig == syscall.SIGCONT)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.proc == nil {
		return fmt.Errorf("kafka %s: broker not running", op)
	}
	if sig == syscall.SIGSTOP {
		return k.proc.Freeze()
	}
	return k.proc.Signal(sig)
}

// Kill sends SIGKILL to the broker (no clean shutdown) and reaps it.
// Produced records survive (kfake writes them to its segment files right
// away); state kfake only saves on a clean stop may not.
func (k *kfakeKafka) Kill() error {
	if k.extern {
		return k.errExternal("kill")
	}
	if k.ctr != nil {
		return k.dockerKill()
	}
	return haltProc(&k.mu, &k.proc, (*Proc).Kill)
}

// Close stops the broker and removes its temp dir. It is meant for cleanup
// and never fails; it does nothing for an external cluster.
func (k *kfakeKafka) Close() {
	if k.extern {
		return
	}
	if k.ctr != nil {
		k.dockerClose()
		return
	}
	if err := k.Stop(); err != nil {
		_ = k.Kill()
	}
	_ = os.RemoveAll(k.dir)
}

// ClientOpts returns kgo options to reach the brokers: seed brokers plus
// the SASL and TLS settings the broker was started with. For TLS the
// certificate file is trusted as a CA (see SelfSignedCert).
func (k *kfakeKafka) ClientOpts() ([]kgo.Opt, error) { return clientOpts(k.brokers, k.opts) }

func clientOpts(brokers []string, o kafkaOptions) ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	if o.saslUser != "" {
		switch strings.ToUpper(o.saslMech) {
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Auth{User: o.saslUser, Pass: o.saslPass}.AsMechanism()))
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: o.saslUser, Pass: o.saslPass}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: o.saslUser, Pass: o.saslPass}.AsSha512Mechanism()))
		default:
			return nil, fmt.Errorf("kafka client: unsupported SASL mechanism %q", o.saslMech)
		}
	}
	if o.certFile != "" {
		ca := o.certFile
		if o.trustCA != "" {
			ca = o.trustCA
		}
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("kafka client: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka client: no certificate in %s", ca)
		}
		cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, ServerName: o.serverName}
		if o.clientCert != "" {
			cert, err := tls.LoadX509KeyPair(o.clientCert, o.clientKey)
			if err != nil {
				return nil, fmt.Errorf("kafka client: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	return opts, nil
}
