package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
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
	reaper    *exec.Cmd
	reaperIn  io.WriteCloser
}

// ApacheNode is one broker+controller JVM of an ApacheKafka.
type ApacheNode struct {
	c        *ApacheKafka
	ID       int32
	port     int // EXTERNAL: clients
	internal int // INTERNAL: replication
	ctrl     int // CONTROLLER: the quorum
	adv      string
	dir      string

	mu     sync.Mutex
	proc   *Proc
	paused bool
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
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	c.clusterID = base64.RawURLEncoding.EncodeToString(id)
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := StartApacheKafka(ctx, n, opts...)
	if err != nil {
		t.Fatalf("starting apache kafka: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.logTails(t)
		}
		c.Close()
	})
	return c
}

func (c *ApacheKafka) logTails(t testing.TB) {
	for _, nd := range c.nodes {
		t.Logf("apache kafka node %d log tail (%s):\n%s", nd.ID, nd.LogFile(), fileTail(nd.LogFile(), 6<<10))
	}
}

func (c *ApacheKafka) boot(ctx context.Context, n int) error {
	var voters []string
	for i := range n {
		nd := &ApacheNode{c: c, ID: int32(i + 1), dir: filepath.Join(c.dir, fmt.Sprintf("node%d", i+1))}
		var err error
		for _, p := range []*int{&nd.port, &nd.internal, &nd.ctrl} {
			if *p, err = FreePort(); err != nil {
				return err
			}
		}
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

func (nd *ApacheNode) configPath() string { return filepath.Join(nd.dir, "server.properties") }

func (nd *ApacheNode) writeConfig(voters string) error {
	c := nd.c
	n := len(c.nodes)
	rf, minISR := min(3, n), 1
	if n >= 3 {
		minISR = 2
	}
	external := "PLAINTEXT"
	switch {
	case c.opts.saslUser != "" && c.opts.certFile != "":
		external = "SASL_SSL"
	case c.opts.saslUser != "":
		external = "SASL_PLAINTEXT"
	case c.opts.certFile != "":
		external = "SSL"
	}
	p := map[string]string{
		"process.roles":                                    "broker,controller",
		"node.id":                                          strconv.Itoa(int(nd.ID)),
		"controller.quorum.voters":                         voters,
		"listeners":                                        fmt.Sprintf("EXTERNAL://127.0.0.1:%d,INTERNAL://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", nd.port, nd.internal, nd.ctrl),
		"advertised.listeners":                             fmt.Sprintf("EXTERNAL://%s,INTERNAL://127.0.0.1:%d", nd.adv, nd.internal),
		"listener.security.protocol.map":                   "EXTERNAL:" + external + ",INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"inter.broker.listener.name":                       "INTERNAL",
		"controller.listener.names":                        "CONTROLLER",
		"log.dirs":                                         filepath.Join(nd.dir, "data"),
		"num.partitions":                                   strconv.Itoa(c.opts.partitions),
		"default.replication.factor":                       strconv.Itoa(rf),
		"min.insync.replicas":                              strconv.Itoa(minISR),
		"unclean.leader.election.enable":                   "false",
		"auto.create.topics.enable":                        "false",
		"offsets.topic.replication.factor":                 strconv.Itoa(rf),
		"offsets.topic.num.partitions":                     "4",
		"transaction.state.log.replication.factor":         strconv.Itoa(rf),
		"transaction.state.log.min.isr":                    strconv.Itoa(minISR),
		"transaction.state.log.num.partitions":             "4",
		"share.coordinator.state.topic.replication.factor": strconv.Itoa(rf),
		"share.coordinator.state.topic.min.isr":            strconv.Itoa(minISR),
		"group.initial.rebalance.delay.ms":                 "0",
		// Notice a frozen follower within seconds, not 30 s.
		"replica.lag.time.max.ms":      "5000",
		"broker.session.timeout.ms":    "6000",
		"broker.heartbeat.interval.ms": "1000",
	}
	if c.opts.saslUser != "" {
		mech := strings.ToUpper(c.opts.saslMech)
		p["sasl.enabled.mechanisms"] = mech
		prefix := "listener.name.external." + strings.ToLower(mech) + ".sasl.jaas.config"
		if mech == "PLAIN" {
			users := fmt.Sprintf(`user_%s="%s"`, c.opts.saslUser, c.opts.saslPass)
			if c.opts.aclUser != "" {
				users += fmt.Sprintf(` user_%s="%s"`, c.opts.aclUser, c.opts.aclPass)
			}
			p[prefix] = "org.apache.kafka.common.security.plain.PlainLoginModule required " + users + ";"
		} else {
			p[prefix] = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
		}
	}
	if c.opts.aclUser != "" {
		if c.opts.saslUser == "" {
			return errors.New("apache kafka: WithACLUser needs WithSASL (the superuser)")
		}
		p["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
		// Brokers and controllers talk PLAINTEXT among themselves (ANONYMOUS).
		p["super.users"] = "User:" + c.opts.saslUser + ";User:ANONYMOUS"
	}
	if c.opts.certFile != "" {
		// One PEM file with the key and the certificate chain.
		key, err := os.ReadFile(c.opts.keyFile)
		if err != nil {
			return fmt.Errorf("apache kafka: %w", err)
		}
		cert, err := os.ReadFile(c.opts.certFile)
		if err != nil {
			return fmt.Errorf("apache kafka: %w", err)
		}
		pemPath := filepath.Join(nd.dir, "keystore.pem")
		if err := os.WriteFile(pemPath, append(key, cert...), 0o600); err != nil {
			return fmt.Errorf("apache kafka: %w", err)
		}
		p["listener.name.external.ssl.keystore.type"] = "PEM"
		p["listener.name.external.ssl.keystore.location"] = pemPath
	}
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, p[k])
	}
	if err := os.WriteFile(nd.configPath(), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("apache kafka: %w", err)
	}
	return nil
}

func (nd *ApacheNode) java(args ...string) []string {
	a := append([]string(nil), jvmFlags...)
	a = append(a, "-Dlog4j2.configurationFile="+filepath.Join(nd.c.dir, "log4j2.properties"), "-cp", filepath.Join(nd.c.libs, "*"))
	return append(a, args...)
}

// format is `kafka-storage.sh format`: it writes meta.properties and the
// bootstrap metadata, plus the SCRAM credential of a SASL/SCRAM cluster.
func (nd *ApacheNode) format(ctx context.Context) error {
	args := []string{"kafka.tools.StorageTool", "format", "-t", nd.c.clusterID, "-c", nd.configPath()}
	if o := nd.c.opts; o.saslUser != "" && strings.HasPrefix(strings.ToUpper(o.saslMech), "SCRAM") {
		args = append(args, "--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", strings.ToUpper(o.saslMech), o.saslUser, o.saslPass))
		if o.aclUser != "" {
			args = append(args, "--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", strings.ToUpper(o.saslMech), o.aclUser, o.aclPass))
		}
	}
	cmd := exec.CommandContext(ctx, "java", nd.java(args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apache kafka: formatting node %d: %w\n%s", nd.ID, err, tail(string(out), 4096))
	}
	return nil
}

// spawn starts the node's JVM without waiting for it: a node of a cluster
// finishes starting only once a quorum of controllers is up, so readiness
// is WaitReady's (answered metadata), never a log line.
func (nd *ApacheNode) spawn(ctx context.Context) error {
	proc, err := StartProc(ctx, "kafka", "java", nd.java("kafka.Kafka", nd.configPath()), nil, nd.dir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(nd.c.dir, fmt.Sprintf("node%d.pid", nd.ID)), []byte(strconv.Itoa(proc.Pid())), 0o644); err != nil {
		_ = proc.Kill()
		return fmt.Errorf("apache kafka: %w", err)
	}
	nd.proc, nd.paused = proc, false
	return nil
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
	if c.reaper != nil {
		_ = c.reaper.Process.Kill()
		_ = c.reaper.Wait()
		_ = c.reaperIn.Close()
	}
}

// apacheReaper SIGKILLs the JVM process groups whose ids are in DIR/*.pid
// and removes DIR once stdin closes: the test process is gone.
const apacheReaper = `read _; for f in "$1"/*.pid; do [ -f "$f" ] && kill -9 -- "-$(cat "$f")" 2>/dev/null; done; rm -rf "$1"`

func (c *ApacheKafka) startReaper() error {
	cmd := exec.Command("/bin/sh", "-c", apacheReaper, "outboxd-kafka-reaper", c.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("starting kafka reaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting kafka reaper: %w", err)
	}
	c.reaper, c.reaperIn = cmd, in
	return nil
}

// Addr is the node's own client address.
func (nd *ApacheNode) Addr() string { return fmt.Sprintf("127.0.0.1:%d", nd.port) }

// Advertised is the client address the node sends clients to.
func (nd *ApacheNode) Advertised() string { return nd.adv }

// LogFile is the node's output.
func (nd *ApacheNode) LogFile() string { return filepath.Join(nd.dir, "kafka.log") }

// Running reports whether the node's JVM is up (paused counts as up).
func (nd *ApacheNode) Running() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.proc != nil && !nd.proc.Exited()
}

// Paused reports whether the node is frozen.
func (nd *ApacheNode) Paused() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.paused
}

func (nd *ApacheNode) exited() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.proc != nil && nd.proc.Exited()
}

// Exited reports whether a started node died by itself.
func (nd *ApacheNode) Exited() bool { return nd.exited() }

func (nd *ApacheNode) start(ctx context.Context) error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.proc != nil && !nd.proc.Exited() {
		return nil
	}
	nd.proc = nil
	return nd.spawn(ctx)
}

// Start restarts a stopped or killed node (same ports, same data) and waits
// until every running node answers metadata listing all of them. A node
// that needs others for a quorum waits for them: start those with
// StartNoWait first.
func (nd *ApacheNode) Start(ctx context.Context) error {
	if err := nd.start(ctx); err != nil {
		return err
	}
	return nd.c.WaitReady(ctx)
}

// StartNoWait starts a stopped or killed node and returns at once.
func (nd *ApacheNode) StartNoWait(ctx context.Context) error { return nd.start(ctx) }

// Stop shuts the node down cleanly (SIGTERM: controlled shutdown) and waits
// up to two minutes, then kills it.
func (nd *ApacheNode) Stop() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.proc == nil {
		return nil
	}
	proc := nd.proc
	nd.proc = nil
	if nd.paused {
		_ = proc.Signal(syscall.SIGCONT)
		nd.paused = false
	}
	err := proc.Stop(2 * time.Minute)
	if err != nil && strings.Contains(err.Error(), "exit code 143") {
		return nil // a JVM exiting on SIGTERM reports 128+15
	}
	return err
}

// Kill SIGKILLs the node (no controlled shutdown) and reaps it.
func (nd *ApacheNode) Kill() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.proc == nil {
		return nil
	}
	proc := nd.proc
	nd.proc, nd.paused = nil, false
	return proc.Kill()
}

// Pause freezes the node (SIGSTOP): connections stay open, nothing is
// answered, its quorum and replica peers time it out.
func (nd *ApacheNode) Pause() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.proc == nil || nd.paused {
		return nil
	}
	nd.paused = true
	return nd.proc.Signal(syscall.SIGSTOP)
}

// Resume undoes Pause (SIGCONT).
func (nd *ApacheNode) Resume() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.proc == nil || !nd.paused {
		return nil
	}
	nd.paused = false
	return nd.proc.Signal(syscall.SIGCONT)
}

// admin runs fn with an admin client on the running, unpaused nodes.
func (c *ApacheKafka) admin(ctx context.Context, fn func(*kadm.Client, *kgo.Client) error) error {
	var up []*ApacheNode
	for _, nd := range c.nodes {
		if nd.Running() && !nd.Paused() {
			up = append(up, nd)
		}
	}
	if len(up) == 0 {
		return errors.New("apache kafka: no node running")
	}
	opts, err := c.adminOpts(up...)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return fn(kadm.NewClient(cl), cl)
}

// Leader returns the node leading topic's partition.
func (c *ApacheKafka) Leader(ctx context.Context, topic string, partition int32) (*ApacheNode, error) {
	var leader int32 = -1
	err := c.admin(ctx, func(adm *kadm.Client, _ *kgo.Client) error {
		md, err := adm.Metadata(ctx, topic)
		if err != nil {
			return err
		}
		td, ok := md.Topics[topic]
		if !ok || td.Err != nil {
			return fmt.Errorf("topic %s: %v", topic, td.Err)
		}
		p, ok := td.Partitions[partition]
		if !ok || p.Err != nil {
			return fmt.Errorf("topic %s partition %d: %v", topic, partition, p.Err)
		}
		leader = p.Leader
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("apache kafka: leader of %s/%d: %w", topic, partition, err)
	}
	if nd := c.Node(leader); nd != nil {
		return nd, nil
	}
	return nil, fmt.Errorf("apache kafka: %s/%d has no leader (%d)", topic, partition, leader)
}

// ActiveController returns the node leading the KRaft quorum.
func (c *ApacheKafka) ActiveController(ctx context.Context) (*ApacheNode, error) {
	var leader int32 = -1
	err := c.admin(ctx, func(_ *kadm.Client, cl *kgo.Client) error {
		req := kmsg.NewPtrDescribeQuorumRequest()
		t := kmsg.NewDescribeQuorumRequestTopic()
		t.Topic = "__cluster_metadata"
		p := kmsg.NewDescribeQuorumRequestTopicPartition()
		t.Partitions = append(t.Partitions, p)
		req.Topics = append(req.Topics, t)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		if len(resp.Topics) == 0 || len(resp.Topics[0].Partitions) == 0 {
			return errors.New("empty DescribeQuorum response")
		}
		leader = resp.Topics[0].Partitions[0].LeaderID
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("apache kafka: active controller: %w", err)
	}
	if nd := c.Node(leader); nd != nil {
		return nd, nil
	}
	return nil, fmt.Errorf("apache kafka: no active controller (%d)", leader)
}

// TxnCoordinator returns the node coordinating transactionalID.
func (c *ApacheKafka) TxnCoordinator(ctx context.Context, transactionalID string) (*ApacheNode, error) {
	var id int32 = -1
	err := c.admin(ctx, func(adm *kadm.Client, _ *kgo.Client) error {
		resp := adm.FindTxnCoordinators(ctx, transactionalID)
		r, ok := resp[transactionalID]
		if !ok || r.Err != nil {
			return fmt.Errorf("coordinator of %s: %v", transactionalID, r.Err)
		}
		id = r.NodeID
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("apache kafka: %w", err)
	}
	if nd := c.Node(id); nd != nil {
		return nd, nil
	}
	return nil, fmt.Errorf("apache kafka: no transaction coordinator for %s (%d)", transactionalID, id)
}
