package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ApacheKafka is a real Apache Kafka cluster in KRaft mode, run from the
// Maven Central jars (see KafkaLibs) as local JVM processes: every node is
// broker and controller at once, so n nodes make an n-voter quorum. Clients
// reach the EXTERNAL listener (plain, or SASL/TLS per the options); brokers
// talk to each other on INTERNAL, controllers on CONTROLLER, all on
// 127.0.0.1.
//
// Topic defaults are production's: auto.create.topics.enable=false,
// unclean.leader.election.enable=false and, with 3 nodes or more,
// replication factor 3 and min.insync.replicas 2 for new topics and for the
// transaction state log.
//
// Every node keeps its ports and data across Stop/Start and Kill/Start. A
// reaper child SIGKILLs every JVM and removes the data should the test
// process die without cleaning up.
type ApacheKafka struct {
	mu        sync.Mutex
	opts      kafkaOptions
	version   string
	libs      string
	dir       string
	clusterID string
	nodes     []*ApacheNode
	reaper    *jvmReaper
}

// WithAdvertisedAddrs makes node i advertise addrs[i] on its client
// listener (a proxy in front of it, say) instead of its own address.
func WithAdvertisedAddrs(addrs ...string) KafkaOption {
	return func(o *kafkaOptions) { o.advertise = append([]string(nil), addrs...) }
}

// jvmFlags keep a node small and quick to start: C1 only (the tests are
// short; startup dominates), serial GC, class data sharing.
var jvmFlags = []string{"-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
	"-Djava.awt.headless=true", "-XX:-UsePerfData"}

// apacheLog4j is a log4j2 properties file (the properties format needs no
// extra jars, unlike YAML): INFO to stdout, the chattiest loggers at WARN.
const apacheLog4j = `status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = STDOUT
logger.req.name = kafka.request.logger
logger.req.level = warn
logger.sc.name = state.change.logger
logger.sc.level = warn
logger.cl.name = org.apache.kafka.clients
logger.cl.level = warn
`

// StartApacheKafka formats and starts an n-node cluster and waits until
// every broker is registered and answers metadata. Options: WithSASL,
// WithTLS, WithPartitions (num.partitions), WithAdvertisedAddrs. Close it
// when done.
func StartApacheKafka(ctx context.Context, n int, opts ...KafkaOption) (*ApacheKafka, error) {
	if n < 1 {
		return nil, fmt.Errorf("apache kafka: %d nodes", n)
	}
	c := &ApacheKafka{opts: kafkaOptions{partitions: 3}, version: KafkaVersion()}
	for _, o := range opts {
		o(&c.opts)
	}
	if len(c.opts.advertise) != 0 && len(c.opts.advertise) != n {
		return nil, fmt.Errorf("apache kafka: %d advertised addresses for %d nodes", len(c.opts.advertise), n)
	}
	if _, err := exec.LookPath("java"); err != nil {
		return nil, fmt.Errorf("apache kafka needs a Java 17+ runtime (java) in PATH: %w", err)
	}
	var err error
	if c.libs, err = KafkaLibs(ctx, c.version); err != nil {
		return nil, err
	}
	if c.dir, err = os.MkdirTemp("", "outboxd-apache-kafka-"); err != nil {
		return nil, fmt.Errorf("apache kafka: %w", err)
	}
	if err := c.startReaper(); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	// kafka-storage's argument parser takes an id starting with '-' (one in
	// 64 base64url ids) for an option: draw again.
	for c.clusterID == "" || c.clusterID[0] == '-' {
		id := make([]byte, 16)
		_, _ = rand.Read(id)
		c.clusterID = base64.RawURLEncoding.EncodeToString(id)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "log4j2.properties"), []byte(apacheLog4j), 0o644); err != nil {
		c.Close()
		return nil, fmt.Errorf("apache kafka: %w", err)
	}
	for attempt := 1; ; attempt++ {
		err = c.boot(ctx, n)
		if err == nil {
			return c, nil
		}
		c.killAll()
		if attempt == 3 || ctx.Err() != nil || !strings.Contains(err.Error(), "Address already in use") {
			c.Close()
			return nil, err
		}
		c.nodes = nil // a port was taken meanwhile: new ports, new data
	}
}

// ApacheKafkaForTest is StartApacheKafka for one test: closed when it ends,
// with the nodes' log tails in the output of a failed test.
func ApacheKafkaForTest(t testing.TB, n int, opts ...KafkaOption) *ApacheKafka {
	t.Helper()
	return serverForTest(t, "apache kafka", 5*time.Minute, func(ctx context.Context) (*ApacheKafka, error) { return StartApacheKafka(ctx, n, opts...) },
		func(c *ApacheKafka) {
			c.logTails(t)
		})
}

func (c *ApacheKafka) logTails(t testing.TB) {
	for _, nd := range c.nodes {
		t.Logf("apache kafka node %d log tail (%s):\n%s", nd.ID, nd.LogFile(), fileTail(nd.LogFile(), 6<<10))
	}
}

func (c *ApacheKafka) boot(ctx context.Context, n int) error {
	var voters []string
	ports, err := FreePorts(3 * n) // distinct: a node refuses two listeners on one port
	if err != nil {
		return err
	}
	for i := range n {
		nd := &ApacheNode{c: c, ID: int32(i + 1), dir: filepath.Join(c.dir, fmt.Sprintf("node%d", i+1))}
		nd.port, nd.internal, nd.ctrl = ports[3*i], ports[3*i+1], ports[3*i+2]
		nd.adv = fmt.Sprintf("127.0.0.1:%d", nd.port)
		if len(c.opts.advertise) > 0 {
			nd.adv = c.opts.advertise[i]
		}
		_ = os.RemoveAll(nd.dir)
		if err := os.MkdirAll(nd.dir, 0o755); err != nil {
			return fmt.Errorf("apache kafka: %w", err)
		}
		c.nodes = append(c.nodes, nd)
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", nd.ID, nd.ctrl))
	}
	for _, nd := range c.nodes {
		if err := nd.writeConfig(strings.Join(voters, ",")); err != nil {
			return err
		}
	}
	// Format in parallel: each is a JVM start.
	errs := make(chan error, n)
	for _, nd := range c.nodes {
		go func() { errs <- nd.format(ctx) }()
	}
	var ferr error
	for range n {
		ferr = errors.Join(ferr, <-errs)
	}
	if ferr != nil {
		return ferr
	}
	for _, nd := range c.nodes {
		if err := nd.spawn(ctx); err != nil {
			return err
		}
	}
	return c.WaitReady(ctx)
}

// adminOpts are client options to reach the given nodes directly (their
// own addresses, whatever they advertise).
func (c *ApacheKafka) adminOpts(nodes ...*ApacheNode) ([]kgo.Opt, error) {
	opts, err := c.ClientOpts()
	if err != nil {
		return nil, err
	}
	var seeds []string
	for _, nd := range nodes {
		seeds = append(seeds, nd.Addr())
	}
	opts = append(opts, kgo.SeedBrokers(seeds...), kgo.RequestRetries(2))
	if c.opts.certFile == "" { // kgo takes a Dialer or a TLS config, not both
		opts = append(opts, kgo.Dialer(c.DialRedirect()))
	}
	return opts, nil
}

// WaitReady waits until every running node is registered with the quorum
// and answers metadata.
func (c *ApacheKafka) WaitReady(ctx context.Context) error {
	c.mu.Lock()
	var running []*ApacheNode
	for _, nd := range c.nodes {
		if nd.Running() {
			running = append(running, nd)
		}
	}
	c.mu.Unlock()
	if len(running) == 0 {
		return nil
	}
	opts, err := c.adminOpts(running...)
	if err != nil {
		return err
	}
	for {
		err := c.ready(ctx, opts, running)
		if err == nil {
			return nil
		}
		for _, nd := range running {
			if nd.exited() {
				return fmt.Errorf("apache kafka node %d exited; log tail:\n%s", nd.ID, fileTail(nd.LogFile(), 4096))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apache kafka not ready: %w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *ApacheKafka) ready(ctx context.Context, opts []kgo.Opt, running []*ApacheNode) error {
	for _, nd := range running {
		cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(nd.Addr()))...)
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		md, err := kadm.NewClient(cl).BrokerMetadata(rctx)
		cancel()
		cl.Close()
		if err != nil {
			return fmt.Errorf("node %d: %w", nd.ID, err)
		}
		if len(md.Brokers) < len(running) {
			return fmt.Errorf("node %d sees %d of %d brokers", nd.ID, len(md.Brokers), len(running))
		}
	}
	return nil
}

// Version is the Apache Kafka release running.
func (c *ApacheKafka) Version() string { return c.version }

// Nodes returns the nodes, ordered by ID (1..n).
func (c *ApacheKafka) Nodes() []*ApacheNode { return append([]*ApacheNode(nil), c.nodes...) }

// Node returns the node with the given ID (nil if none).
func (c *ApacheKafka) Node(id int32) *ApacheNode {
	for _, nd := range c.nodes {
		if nd.ID == id {
			return nd
		}
	}
	return nil
}

// Brokers returns the advertised client addresses of all nodes.
func (c *ApacheKafka) Brokers() []string {
	var out []string
	for _, nd := range c.nodes {
		out = append(out, nd.adv)
	}
	return out
}

// External is false: the harness started this cluster.
func (c *ApacheKafka) External() bool { return false }

// LogFile is the first node's log.
func (c *ApacheKafka) LogFile() string { return c.nodes[0].LogFile() }

// ClientOpts returns kgo options to reach the cluster: seed brokers plus the
// SASL and TLS settings it was started with.
func (c *ApacheKafka) ClientOpts() ([]kgo.Opt, error) {
	return clientOpts(c.Brokers(), c.opts)
}

// DialRedirect returns a dialer that sends connections for a node's
// advertised address (a proxy, see WithAdvertisedAddrs) straight to the
// node, so test clients bypass the faults a proxy injects.
func (c *ApacheKafka) DialRedirect() func(ctx context.Context, network, host string) (net.Conn, error) {
	m := map[string]string{}
	for _, nd := range c.nodes {
		m[nd.adv] = nd.Addr()
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		if real, ok := m[host]; ok {
			host = real
		}
		return d.DialContext(ctx, network, host)
	}
}

// Start starts every stopped node and waits until the cluster is ready.
func (c *ApacheKafka) Start(ctx context.Context) error {
	for _, nd := range c.nodes {
		if err := nd.start(ctx); err != nil {
			return err
		}
	}
	return c.WaitReady(ctx)
}

// Stop shuts every node down cleanly, in parallel (a controlled shutdown of
// one node waits for the others' quorum).
func (c *ApacheKafka) Stop() error {
	errs := make(chan error, len(c.nodes))
	for _, nd := range c.nodes {
		go func() { errs <- nd.Stop() }()
	}
	var err error
	for range c.nodes {
		err = errors.Join(err, <-errs)
	}
	return err
}

// Kill SIGKILLs every node.
func (c *ApacheKafka) Kill() error {
	var err error
	for _, nd := range c.nodes {
		err = errors.Join(err, nd.Kill())
	}
	return err
}

// Pause freezes every node (SIGSTOP).
func (c *ApacheKafka) Pause() error {
	var err error
	for _, nd := range c.nodes {
		err = errors.Join(err, nd.Pause())
	}
	return err
}

// Resume continues every paused node.
func (c *ApacheKafka) Resume() error {
	var err error
	for _, nd := range c.nodes {
		err = errors.Join(err, nd.Resume())
	}
	return err
}

func (c *ApacheKafka) killAll() {
	for _, nd := range c.nodes {
		_ = nd.Kill()
	}
}

// Close stops every node (SIGKILL after a failed clean stop) and removes the
// data. It never fails.
func (c *ApacheKafka) Close() {
	if err := c.Stop(); err != nil {
		c.killAll()
	}
	c.killAll()
	_ = os.RemoveAll(c.dir)
	c.reaper.close()
}

func (c *ApacheKafka) startReaper() (err error) {
	c.reaper, err = startJVMReaper("outboxd-kafka-reaper", c.dir)
	return err
}
