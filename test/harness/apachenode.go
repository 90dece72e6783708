package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

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
		if c.opts.clientCA != "" { // mutual TLS: a PEM truststore of the client CA
			p["listener.name.external.ssl.client.auth"] = "required"
			p["listener.name.external.ssl.truststore.type"] = "PEM"
			p["listener.name.external.ssl.truststore.location"] = c.opts.clientCA
		}
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
	// --cluster-id=ID: a random id may start with "-", which argparse would take for an option.
	args := []string{"kafka.tools.StorageTool", "format", "--cluster-id=" + nd.c.clusterID, "-c", nd.configPath()}
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

// Pid is the process id of the node's JVM, 0 while it is not running.
func (nd *ApacheNode) Pid() int {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.proc == nil || nd.proc.Exited() {
		return 0
	}
	return nd.proc.Pid()
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
	return haltProc(&nd.mu, &nd.proc, func(p *Proc) error {
		if nd.paused {
			_ = p.Signal(syscall.SIGCONT)
			nd.paused = false
		}
		return stopJVM(p)
	})
}

// Kill SIGKILLs the node (no controlled shutdown) and reaps it.
func (nd *ApacheNode) Kill() error {
	return haltProc(&nd.mu, &nd.proc, func(p *Proc) error {
		nd.paused = false
		return p.Kill()
	})
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
	return nd.proc.Freeze()
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
