package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitMQServer is the rabbitmq-server script of Debian's package
// (.ci/rabbitmq.sh installs it). /usr/sbin/rabbitmq-server is a wrapper
// that switches to the rabbitmq user and the system's data directory; the
// harness runs the real script as the test user on a private directory.
const RabbitMQServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// RabbitMQ is a private single RabbitMQ node: its own node name, data and
// log directory, Erlang cookie and epmd (on a private port, listening on
// loopback: 127.0.0.1, and ::1, which epmd always adds), every listener on
// 127.0.0.1, no plugins (management off unless conf sets management.tcp.*). A reaper SIGKILLs it and removes its directory
// if the test process dies without closing it.
type RabbitMQ struct {
	dir                      string
	name                     string
	port, distPort, epmdPort int
	conf                     []string   // extra rabbitmq.conf lines
	reaper                   *jvmReaper // the JVM reaper's mechanics, with rabbitmqReaperScript

	mu   sync.Mutex
	proc *Proc
}

// StartRabbitMQ starts a node and waits until it takes an AMQP connection.
// conf are extra rabbitmq.conf lines ("max_message_size = 1048576").
func StartRabbitMQ(ctx context.Context, conf ...string) (*RabbitMQ, error) {
	if _, err := os.Stat(RabbitMQServer); err != nil {
		return nil, fmt.Errorf("rabbitmq: %s not found: install Debian's rabbitmq-server package (.ci/rabbitmq.sh): %w", RabbitMQServer, err)
	}
	if _, err := exec.LookPath("epmd"); err != nil {
		return nil, fmt.Errorf("rabbitmq: epmd (Erlang) not in PATH: %w", err)
	}
	r := &RabbitMQ{conf: conf}
	var err error
	if r.dir, err = os.MkdirTemp("", "outboxd-rabbitmq-"); err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	// No plugins, whatever /etc/rabbitmq/enabled_plugins says; the
	// management plugin when conf sets its listener (management.tcp.*).
	plugins := "[].\n"
	if slices.ContainsFunc(conf, func(l string) bool { return strings.HasPrefix(l, "management.") }) {
		plugins = "[rabbitmq_management].\n"
	}
	files := map[string]string{
		"enabled_plugins": plugins,
		// Instead of /etc/rabbitmq/rabbitmq-env.conf.
		"rabbitmq-env.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(content), 0o644); err != nil {
			os.RemoveAll(r.dir)
			return nil, fmt.Errorf("rabbitmq: %w", err)
		}
	}
	if err := r.startOnFreePorts(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// startOnFreePorts starts the node on three new distinct ports (AMQP,
// Erlang distribution, epmd). The node binds them seconds after FreePorts
// let them go, and a server another suite started meanwhile may take one
// (make test runs suites side by side): a node that fails for a taken port
// (rabbitPortTaken) is started again on new ports, three times in all.
func (r *RabbitMQ) startOnFreePorts(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := r.boot(ctx)
		if err == nil || attempt == 3 || ctx.Err() != nil || !r.portTaken() {
			return err
		}
	}
}

// boot kills the node of an earlier attempt, if any, and stops the epmd it
// started (a daemon, outside the node's process group), picks the ports,
// starts a reaper that knows the new epmd port (then closes the earlier
// one: one of them always runs), writes rabbitmq.conf and starts the node,
// whose name carries the AMQP port.
func (r *RabbitMQ) boot(ctx context.Context) error {
	_ = r.Kill()
	stopEpmd(r.epmdPort)
	ports, err := FreePorts(3) // distinct
	if err != nil {
		return err
	}
	r.port, r.distPort, r.epmdPort = ports[0], ports[1], ports[2]
	reaper, err := startRabbitMQReaper(r.dir, r.epmdPort)
	if err != nil {
		return err
	}
	r.reaper.close()
	r.reaper = reaper
	r.name = fmt.Sprintf("outboxd-test-%d@localhost", r.port)
	conf := fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d\nloopback_users = none\n", r.port) + strings.Join(append(r.conf, ""), "\n")
	if err := os.WriteFile(filepath.Join(r.dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("rabbitmq: %w", err)
	}
	return r.Start(ctx)
}

// rabbitPortTakenSigns are what a node prints when it exits because one of
// its ports was taken (seen with RabbitMQ 3.10 on Erlang/OTP 25, holding
// the port with a listener): the AMQP port ({could_not_start_listener,
// "127.0.0.1",Port,... {listen_error,...,eaddrinuse}}), the distribution
// port ("ERROR: could not bind to distribution port Port ...", reason
// {dist_port_already_used,Port,not_erlang,"localhost"}), and the epmd port,
// whose holder is not epmd: the node's epmd cannot listen, and the node's
// registration there fails ("Protocol 'inet_tcp': register/listen error:
// epmd_close" from a holder that hangs up, no_reg_reply_from_epmd after 20 s
// from one that does not answer).
var rabbitPortTakenSigns = []string{"eaddrinuse", "dist_port_already_used", "register/listen error: epmd_close", "register/listen error: no_reg_reply_from_epmd"}

// rabbitPortTaken reports whether a node's output says it failed for a port
// another process holds.
func rabbitPortTaken(log string) bool {
	return slices.ContainsFunc(rabbitPortTakenSigns, func(s string) bool { return strings.Contains(log, s) })
}

// portTaken is rabbitPortTaken of the node's last start (its whole output:
// the epmd failure is far from the end of it).
func (r *RabbitMQ) portTaken() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && rabbitPortTaken(r.proc.Log())
}

// RabbitMQForTest is StartRabbitMQ for one test: closed when it ends, with
// the node's log tail in the output of a failed test.
func RabbitMQForTest(t testing.TB, conf ...string) *RabbitMQ {
	t.Helper()
	return serverForTest(t, "rabbitmq", 3*time.Minute, func(ctx context.Context) (*RabbitMQ, error) { return StartRabbitMQ(ctx, conf...) },
		func(r *RabbitMQ) {
			r.mu.Lock()
			if r.proc != nil {
				t.Logf("rabbitmq log tail:\n%s", tail(r.proc.Log(), 4096))
			}
			r.mu.Unlock()
		})
}

// Channel opens an AMQP channel on the node for a test's own declarations
// and reads; its connection is closed when the test ends.
func (r *RabbitMQ) Channel(t testing.TB) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// LogTail is the end of the node's output.
func (r *RabbitMQ) LogTail() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return ""
	}
	return tail(r.proc.Log(), 4096)
}

// URL is the node's AMQP URI (the guest user, the default vhost).
func (r *RabbitMQ) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", r.port) }

// Addr is the node's AMQP listener.
func (r *RabbitMQ) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

// env is the node's environment: everything the scripts would otherwise
// take from /etc/rabbitmq, /var/lib/rabbitmq or $HOME points into r.dir.
func (r *RabbitMQ) env() []string {
	return []string{
		"HOME=" + r.dir, // the Erlang cookie
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_EPMD_PORT=" + strconv.Itoa(r.epmdPort),
		"RABBITMQ_NODENAME=" + r.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(r.port),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(r.distPort),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(r.dir, "rabbitmq.conf"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(r.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(r.dir, "enabled_plugins"),
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(r.dir, "advanced.config"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(r.dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(r.dir, "log"),
		"RABBITMQ_PID_FILE=" + filepath.Join(r.dir, "beam.pidfile"),
		"RABBITMQ_LOGS=-",
		"ERL_CRASH_DUMP=" + filepath.Join(r.dir, "erl_crash.dump"),
		// Distribution (rabbitmqctl) on loopback only.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
	}
}

// Start starts a stopped or killed node (same ports, same data) and waits
// until it takes an AMQP connection.
func (r *RabbitMQ) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil || r.proc.Exited() {
		// In r.dir: Erlang and Mnesia write their crash dumps to the
		// working directory, which would otherwise be the test's package.
		p, err := StartProc(ctx, "rabbitmq", "/bin/sh", []string{"-c", `cd "$0" && exec "$1"`, r.dir, RabbitMQServer}, r.env(), r.dir)
		if err != nil {
			return fmt.Errorf("rabbitmq: %w", err)
		}
		r.proc = p
		if err := r.writePid("rabbitmq", p); err != nil {
			return err
		}
	}
	return r.waitReady(ctx, r.proc)
}

func (r *RabbitMQ) writePid(name string, p *Proc) error {
	// The reaper kills every process group named in r.dir/*.pid.
	if err := os.WriteFile(filepath.Join(r.dir, name+".pid"), []byte(strconv.Itoa(p.Pid())), 0o644); err != nil {
		_ = p.Kill()
		return fmt.Errorf("rabbitmq: %w", err)
	}
	return nil
}

// waitReady dials AMQP until a connection opens (a node takes TCP
// connections before it boots, so a TCP dial proves nothing).
func (r *RabbitMQ) waitReady(ctx context.Context, p *Proc) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		conn, err := amqp.DialConfig(r.URL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err == nil {
			conn.Close()
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("rabbitmq exited while starting; log tail:\n%s", tail(p.Log(), 4096))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rabbitmq did not take an AMQP connection: %w (last: %v); log tail:\n%s", ctx.Err(), err, tail(p.Log(), 4096))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Ctl runs rabbitmqctl against the node (add_user, set_permissions, ...)
// and returns its output.
func (r *RabbitMQ) Ctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.Dir(RabbitMQServer), "rabbitmqctl"), append([]string{"-n", r.name}, args...)...)
	// The CLI is an Erlang node too: its distribution listener on loopback.
	cmd.Env = append(os.Environ(), append(r.env(), "RABBITMQ_CTL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Running reports whether the node's process is up.
func (r *RabbitMQ) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && !r.proc.Exited()
}

// Stop shuts the node down cleanly (SIGTERM: the script runs rabbitmqctl
// stop) and waits up to a minute, then kills it.
func (r *RabbitMQ) Stop() error {
	return haltProc(&r.mu, &r.proc, func(p *Proc) error {
		err := p.Stop(time.Minute)
		_ = p.Kill() // the Erlang VM and its port programs, if the script left them
		return err
	})
}

// Kill SIGKILLs the node's process group (no clean shutdown) and reaps it.
func (r *RabbitMQ) Kill() error {
	return haltProc(&r.mu, &r.proc, (*Proc).Kill)
}

// Close stops the node (killing it if a clean stop fails), its epmd, and
// removes its directory. It never fails.
func (r *RabbitMQ) Close() {
	if err := r.Stop(); err != nil {
		_ = r.Kill()
	}
	stopEpmd(r.epmdPort)
	_ = os.RemoveAll(r.dir)
	r.reaper.close()
}

// rabbitmqReaperScript SIGKILLs the process groups named in DIR/*.pid (the
// node's script with its Erlang VM), then the node's epmd, and removes DIR
// once its stdin closes. dash's kill takes "-PGID" but not "-- -PGID".
// timeout: as in stopEpmd.
const rabbitmqReaperScript = `read _; for f in "$1"/*.pid; do [ -f "$f" ] && kill -9 "-$(cat "$f")" 2>/dev/null; done; for i in 1 2 3 4 5 6 7 8 9 10; do timeout 2 epmd -port "$2" -kill >/dev/null 2>&1; timeout 2 epmd -port "$2" -names >/dev/null 2>&1 || break; sleep 0.5; done; rm -rf "$1"`

// stopEpmd stops the epmd the node started on port (a daemon, outside any
// process group of the harness). The node must be gone first, or its epmd
// monitor would start another; epmd refuses -kill while it still lists the
// node, so it is asked again until it is gone (-names fails), for 5 s.
// Each call gets 2 s: when another server took the port before the node's
// epmd could, epmd's client may wait for its answer forever.
func stopEpmd(port int) {
	if port == 0 { // none picked yet
		return
	}
	epmd := func(arg string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return exec.CommandContext(ctx, "epmd", "-port", strconv.Itoa(port), arg).Run()
	}
	for range 10 {
		_ = epmd("-kill")
		if epmd("-names") != nil {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func startRabbitMQReaper(dir string, epmdPort int) (*jvmReaper, error) {
	cmd := exec.Command("/bin/sh", "-c", rabbitmqReaperScript, "outboxd-rabbitmq-reaper", dir, strconv.Itoa(epmdPort))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("starting the rabbitmq reaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the rabbitmq reaper: %w", err)
	}
	return &jvmReaper{cmd: cmd, in: in}, nil
}
