package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS is a real nats-server (github.com/nats-io/nats-server/v2, built once
// into the harness's binary cache like outboxd) with JetStream on file
// storage, listening on 127.0.0.1 only. It runs as a child process, so a
// test can SIGKILL it and start it again on the same port and store: what
// JetStream had fsynced survives, as on a real server. The process and its
// directory go when the test process does, however it ends (jvmReaper).
type NATS struct {
	mu     sync.Mutex
	bin    string
	dir    string // config, JetStream store, log, pid file
	port   int
	extra  string
	name   string // server_name ("outboxd-test" if empty)
	route  string // the cluster block of a NATSCluster's node
	tlsCA  string // WithNATSTLS: clients verify the server with this CA
	proc   *Proc  // nil while stopped
	reaper *jvmReaper
}

// NATSOption configures StartNATS.
type NATSOption func(*NATS)

// WithNATSConfig appends lines to the server's configuration file (e.g.
// "max_payload: 4096").
func WithNATSConfig(lines string) NATSOption { return func(n *NATS) { n.extra += lines + "\n" } }

// WithNATSTLS makes the server require TLS, with the given certificate
// and key (issued for 127.0.0.1); URL is then tls://, and the harness's
// own clients verify the server with caFile.
func WithNATSTLS(certFile, keyFile, caFile string) NATSOption {
	return func(n *NATS) {
		n.extra += fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n}\n", certFile, keyFile)
		n.tlsCA = caFile
	}
}

// ClientOptions are the options a client needs to connect (the CA of
// WithNATSTLS).
func (n *NATS) ClientOptions() []nats.Option {
	if n.tlsCA == "" {
		return nil
	}
	return []nats.Option{nats.RootCAs(n.tlsCA)}
}

// StartNATS builds nats-server (once per test process) and starts it.
func StartNATS(ctx context.Context, opts ...NATSOption) (*NATS, error) {
	bin, err := BuildBinary(ctx, "github.com/nats-io/nats-server/v2")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outboxd-nats-")
	if err != nil {
		return nil, fmt.Errorf("creating nats temp dir: %w", err)
	}
	n := &NATS{bin: bin, dir: dir}
	for _, o := range opts {
		o(n)
	}
	if n.reaper, err = startJVMReaper("outboxd-nats-reaper", dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := onFreePort(ctx, &n.port, func() error { return n.Start(ctx) }, nil); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// NATSForTest starts a server that is removed when the test finishes; on
// failure the end of its log is added to the test output.
func NATSForTest(t testing.TB, opts ...NATSOption) *NATS {
	t.Helper()
	return serverForTest(t, "nats-server", 5*time.Minute, func(ctx context.Context) (*NATS, error) { return StartNATS(ctx, opts...) },
		func(n *NATS) {
			t.Logf("nats-server log tail (%s):\n%s", n.LogFile(), fileTail(n.LogFile(), 8<<10))
		})
}

// JetStream connects to the server for a test's own streams and reads; the
// connection is closed when the test ends.
func (n *NATS) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(n.URL(), n.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// URL is the server's client URL.
func (n *NATS) URL() string {
	if n.tlsCA != "" {
		return "tls://127.0.0.1:" + strconv.Itoa(n.port)
	}
	return "nats://127.0.0.1:" + strconv.Itoa(n.port)
}

// Port is the client port (kept across Stop and Start).
func (n *NATS) Port() int { return n.port }

// LogFile is the server's log.
func (n *NATS) LogFile() string { return filepath.Join(n.dir, "nats-server.log") }

func (n *NATS) writeConfig() (string, error) {
	name := n.name
	if name == "" {
		name = "outboxd-test"
	}
	conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n}\n%s%s",
		name, n.port, filepath.Join(n.dir, "js"), n.route, n.extra)
	path := filepath.Join(n.dir, "nats.conf")
	return path, os.WriteFile(path, []byte(conf), 0o644)
}

// Start starts the server (again) and waits until JetStream answers (on a
// cluster's node: once the cluster has a JetStream meta leader).
func (n *NATS) Start(ctx context.Context) error { return n.start(ctx, true) }

func (n *NATS) start(ctx context.Context, wait bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		return errors.New("nats-server is running already")
	}
	conf, err := n.writeConfig()
	if err != nil {
		return fmt.Errorf("nats-server config: %w", err)
	}
	proc, err := StartProc(ctx, "nats-server", n.bin, []string{"-c", conf}, nil, n.dir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.dir, "nats.pid"), []byte(strconv.Itoa(proc.Pid())), 0o644); err != nil {
		_ = proc.Kill()
		return err
	}
	n.proc = proc
	if !wait {
		return nil
	}
	if err := n.waitReady(ctx); err != nil {
		_ = proc.Kill()
		n.proc = nil
		return fmt.Errorf("nats-server did not become ready: %w; log tail:\n%s", err, tail(proc.Log(), 4096))
	}
	return nil
}

func (n *NATS) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if n.proc.Exited() {
			return errors.New("the process exited")
		}
		nc, err := nats.Connect(n.URL(), append(n.ClientOptions(), nats.Timeout(time.Second))...)
		if err == nil {
			js, _ := jetstream.New(nc)
			actx, acancel := context.WithTimeout(ctx, time.Second)
			_, err = js.AccountInfo(actx)
			acancel()
			nc.Close()
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops the server cleanly (SIGTERM).
func (n *NATS) Stop() error { return n.halt(false) }

// Kill SIGKILLs the server: what JetStream had not synced is lost.
func (n *NATS) Kill() error { return n.halt(true) }

func (n *NATS) halt(kill bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return nil
	}
	var err error
	if kill {
		err = n.proc.Kill()
	} else if err = n.proc.Stop(time.Minute); err != nil && !n.proc.Exited() {
		_ = n.proc.Kill()
	}
	n.proc = nil
	return err
}

// Close kills the server and removes its directory.
func (n *NATS) Close() {
	_ = n.Kill()
	n.reaper.close()
	os.RemoveAll(n.dir)
}

// NATSMessage is a message read back from a stream.
type NATSMessage struct {
	Subject string
	Header  nats.Header
	Data    []byte
	Seq     uint64 // stream sequence
}

// ReadStream reads a stream from its first message until it has want
// messages or ctx ends, and returns them in stream order. Reading more than
// want fails the read (a duplicate is a wrong count, not noise): it waits a
// little past want for messages that should not be there.
func ReadStream(ctx context.Context, url, stream string, want int, opts ...nats.Option) ([]NATSMessage, error) {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var out []NATSMessage
	for {
		// Each request on its own deadline: on a cluster, a request sent
		// while a stream elects a new leader can go unanswered, and is
		// then asked again.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := js.Stream(rctx, stream)
		if err == nil {
			last := s.CachedInfo().State.LastSeq
			for seq := uint64(len(out)) + 1; seq <= last && err == nil; seq++ {
				var m *jetstream.RawStreamMsg
				if m, err = s.GetMsg(rctx, seq); err == nil {
					out = append(out, NATSMessage{Subject: m.Subject, Header: m.Header, Data: m.Data, Seq: m.Sequence})
				}
			}
		}
		unanswered := rctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil && !unanswered && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return out, fmt.Errorf("reading stream %s: %w", stream, err)
		}
		if len(out) >= want {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, fmt.Errorf("reading stream %s: %d of %d messages: %w", stream, len(out), want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// NATSCluster is a JetStream cluster of real nats-servers on 127.0.0.1,
// each a NATS of its own (Stop, Kill and Start per node), routed to each
// other: streams created with replicas 3 are stored on three nodes, and a
// PubAck means a majority has the message.
type NATSCluster struct {
	Nodes []*NATS
}

// StartNATSCluster starts size nodes (3 for R3 streams) and waits until
// every one of them answers JetStream requests (a meta leader is elected).
func StartNATSCluster(ctx context.Context, size int) (*NATSCluster, error) {
	bin, err := BuildBinary(ctx, "github.com/nats-io/nats-server/v2")
	if err != nil {
		return nil, err
	}
	c := &NATSCluster{}
	routePorts := make([]int, size)
	ports, err := FreePorts(2 * size) // distinct: client and route ports of every node
	if err != nil {
		return nil, err
	}
	for i := range size {
		n := &NATS{bin: bin, name: fmt.Sprintf("outboxd-test-%d", i+1)}
		if n.dir, err = os.MkdirTemp("", "outboxd-nats-"); err != nil {
			c.Close()
			return nil, fmt.Errorf("creating nats temp dir: %w", err)
		}
		if n.reaper, err = startJVMReaper("outboxd-nats-reaper", n.dir); err != nil {
			os.RemoveAll(n.dir)
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		n.port, routePorts[i] = ports[2*i], ports[2*i+1]
	}
	routes := ""
	for _, p := range routePorts {
		routes += fmt.Sprintf("nats-route://127.0.0.1:%d, ", p)
	}
	for i, n := range c.Nodes {
		n.route = fmt.Sprintf("cluster {\n  name: outboxd-test\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n", routePorts[i], routes)
	}
	// All first, then wait: a node's JetStream answers only once a
	// majority of the cluster is up.
	for _, n := range c.Nodes {
		if err := n.start(ctx, false); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := n.waitReady(ctx); err != nil {
			err = fmt.Errorf("nats-server %s did not become ready: %w; log tail:\n%s", n.name, err, fileTail(n.LogFile(), 4096))
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// NATSClusterForTest starts a cluster that is removed when the test
// finishes; on failure the end of each node's log is added to the output.
func NATSClusterForTest(t testing.TB, size int) *NATSCluster {
	t.Helper()
	return serverForTest(t, "a nats cluster", 5*time.Minute, func(ctx context.Context) (*NATSCluster, error) { return StartNATSCluster(ctx, size) },
		func(c *NATSCluster) {
			for _, n := range c.Nodes {
				t.Logf("%s log tail (%s):\n%s", n.name, n.LogFile(), fileTail(n.LogFile(), 4<<10))
			}
		})
}

// URL lists every node's client URL, comma-separated (what nats.Connect
// and outboxd's --broker take).
func (c *NATSCluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// Name is a node's server_name.
func (n *NATS) Name() string {
	if n.name == "" {
		return "outboxd-test"
	}
	return n.name
}

// StreamLeader is the node that leads stream (its cluster leader),
// waiting (until ctx ends) while the stream has none.
func (c *NATSCluster) StreamLeader(ctx context.Context, stream string) (*NATS, error) {
	info, err := natsStreamInfo(ctx, c.URL(), stream, func(info *jetstream.StreamInfo) bool {
		return info.Cluster != nil && info.Cluster.Leader != ""
	})
	if err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		if n.Name() == info.Cluster.Leader {
			return n, nil
		}
	}
	return nil, fmt.Errorf("stream %s: leader %q is not a node of this cluster", stream, info.Cluster.Leader)
}

// NATSStreamReplicas is the configured replica count of a stream.
func NATSStreamReplicas(ctx context.Context, url, stream string) (int, error) {
	info, err := natsStreamInfo(ctx, url, stream, func(*jetstream.StreamInfo) bool { return true })
	if err != nil {
		return 0, err
	}
	return info.Config.Replicas, nil
}

// natsStreamInfo asks for a stream's info until ok accepts it or ctx
// ends, each request with a deadline of its own (one sent during a leader
// election can go unanswered).
func natsStreamInfo(ctx context.Context, url, stream string, ok func(*jetstream.StreamInfo) bool) (*jetstream.StreamInfo, error) {
	nc, err := nats.Connect(url, nats.Timeout(time.Second))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := js.Stream(rctx, stream)
		cancel()
		if err == nil && ok(s.CachedInfo()) {
			return s.CachedInfo(), nil
		}
		if err == nil {
			err = errors.New("not yet")
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stream %s: %w (last: %v)", stream, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close kills every node and removes their directories.
func (c *NATSCluster) Close() {
	for _, n := range c.Nodes {
		if n.reaper != nil {
			n.Close()
		} else {
			os.RemoveAll(n.dir)
		}
	}
}
