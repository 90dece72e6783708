package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DebeziumOptions configure a Debezium PostgreSQL connector run by Kafka
// Connect standalone (StartDebezium).
type DebeziumOptions struct {
	// DSN is the database to capture (a superuser DSN, as Postgres.DSN gives).
	DSN string
	// Brokers are the Kafka bootstrap servers Connect produces to.
	Brokers []string
	// Slot and Publication name an existing slot (or one Debezium creates)
	// and an existing publication (publication.autocreate.mode=disabled).
	Slot, Publication string
	// Tables is table.include.list ("schema.table", comma-joined); empty:
	// every table of the publication.
	Tables []string
	// Connector holds connector properties (SMT options as
	// transforms.outbox.*, key.converter, value.converter, ...) over
	// test/debezium/connector.properties.
	Connector map[string]string
	// Worker holds worker properties over test/debezium/worker.properties
	// (offset.flush.interval.ms, say).
	Worker map[string]string
	// JVM, when set, replaces the harness's small-heap JVM flags (heap, GC,
	// JIT), e.g. with those connect-standalone.sh uses.
	JVM []string
	// SystemProperties are -D flags added to the JVM's (key=value, without
	// the -D), e.g. otel.java.global-autoconfigure.enabled=true.
	SystemProperties []string
	// Env is added to the worker's environment (KEY=value), e.g. the
	// OpenTelemetry SDK's OTEL_* variables.
	Env []string
	// OTel puts the OpenTelemetry Java API, SDK, autoconfigure and OTLP
	// exporter jars (DebeziumOTelLibs) on Connect's classpath: what
	// Debezium's tracing needs. Without them it is a no-op, as for most
	// Debezium users.
	OTel bool
	// Apicurio puts Apicurio Registry's Kafka Connect converters
	// (ApicurioConverterLibs: io.apicurio.registry.utils.converter.AvroConverter)
	// on Connect's classpath.
	Apicurio bool
}

// Debezium is one Kafka Connect standalone JVM running Debezium's
// PostgreSQL connector with the Outbox Event Router. Its source offsets live
// in a file of its temp dir, so Stop/Start resumes where Debezium left off,
// as a restarted Connect worker does. A reaper child SIGKILLs the JVM and
// removes the dir should the test process die without cleaning up.
type Debezium struct {
	opts     DebeziumOptions
	libs     string
	otelLibs string // "": no OpenTelemetry jars on the classpath
	convLibs string // "": no Apicurio converter jars on the classpath
	dir      string
	port     int // REST listener

	mu     sync.Mutex
	proc   *Proc
	reaper *jvmReaper
}

// DebeziumVersion and ConnectVersion are what test/debezium/pom.xml fetches.
const (
	DebeziumVersion = "3.6.1.Final"
	ConnectVersion  = "4.3.0" // the Kafka Connect release Debezium 3.6 is built against
)

// connectorName is name= in test/debezium/connector.properties.
const connectorName = "outbox-connector"

// DebeziumLibs returns the directory of the Debezium and Kafka Connect jars,
// fetching them with Maven (test/debezium/pom.xml) when the cache lacks
// them, like KafkaLibs.
func DebeziumLibs(ctx context.Context) (string, error) {
	return mavenLibs(ctx, mavenJars{
		what: "Debezium " + DebeziumVersion, dir: "debezium-" + DebeziumVersion, marker: "debezium-connector-postgres-" + DebeziumVersion + ".jar",
		pom: filepath.Join("test", "debezium", "pom.xml"), script: ".ci/debezium.sh",
	})
}

// OTelJavaVersion is the opentelemetry-bom version of test/debezium/pom.xml's
// otel profile.
const OTelJavaVersion = "1.68.0"

// DebeziumOTelLibs returns the directory of the OpenTelemetry Java jars
// (test/debezium/pom.xml, profile otel), fetching them when the cache lacks
// them. Only the io.opentelemetry jars are copied: Debezium's are in
// DebeziumLibs.
func DebeziumOTelLibs(ctx context.Context) (string, error) {
	return mavenLibs(ctx, mavenJars{
		what: "OpenTelemetry Java " + OTelJavaVersion, dir: "opentelemetry-java-" + OTelJavaVersion,
		marker: "opentelemetry-exporter-sender-jdk-" + OTelJavaVersion + ".jar",
		pom:    filepath.Join("test", "debezium", "pom.xml"), script: ".ci/debezium.sh",
		props: []string{"-P", "otel", "-DincludeGroupIds=io.opentelemetry"},
	})
}

// ApicurioConverterLibs returns the directory of Apicurio Registry's Kafka
// Connect converter jars (test/debezium/pom.xml, profile apicurio), of the
// release StartApicurio runs, fetching them when the cache lacks them. Only
// what Connect's classpath lacks is copied (the converter's own Kafka and
// Jackson are older releases of Connect's).
func ApicurioConverterLibs(ctx context.Context) (string, error) {
	return mavenLibs(ctx, mavenJars{
		what: "Apicurio Registry converters " + ApicurioVersion, dir: "apicurio-converter-" + ApicurioVersion,
		marker: "apicurio-registry-utils-converter-" + ApicurioVersion + ".jar",
		pom:    filepath.Join("test", "debezium", "pom.xml"), script: ".ci/debezium.sh",
		props: []string{"-P", "apicurio", "-DincludeGroupIds=io.apicurio,org.apache.avro,org.apache.commons,javax.ws.rs"},
	})
}

// StartDebezium writes the worker and connector configs and starts Kafka
// Connect standalone, waiting until the connector's task is RUNNING (REST
// API) and holds the slot (pg_replication_slots.active). Close it when done.
func StartDebezium(ctx context.Context, opts DebeziumOptions) (*Debezium, error) {
	if opts.Slot == "" || opts.Publication == "" || opts.DSN == "" || len(opts.Brokers) == 0 {
		return nil, errors.New("debezium: DSN, Brokers, Slot and Publication are required")
	}
	if _, err := exec.LookPath("java"); err != nil {
		return nil, fmt.Errorf("debezium needs a Java 17+ runtime (java) in PATH: %w", err)
	}
	d := &Debezium{opts: opts}
	var err error
	if d.libs, err = DebeziumLibs(ctx); err != nil {
		return nil, err
	}
	if opts.OTel {
		if d.otelLibs, err = DebeziumOTelLibs(ctx); err != nil {
			return nil, err
		}
	}
	if opts.Apicurio {
		if d.convLibs, err = ApicurioConverterLibs(ctx); err != nil {
			return nil, err
		}
	}
	if d.dir, err = os.MkdirTemp("", "outboxd-debezium-"); err != nil {
		return nil, fmt.Errorf("debezium: %w", err)
	}
	if err := d.startReaper(); err != nil {
		os.RemoveAll(d.dir)
		return nil, err
	}
	if err := d.startOnFreePort(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// startOnFreePort writes the configs with a free REST port and starts the
// worker. Connect binds the port seconds after FreePort let it go (the JVM
// starts, scans its plugins and asks Kafka for the cluster id first), and a
// server another suite started meanwhile may take it (make test runs suites
// side by side): a worker that exits because it could not bind
// (restBindFailed) is started again on a new port (onFreePort). It binds
// before it starts the connector, so the failed worker neither read the
// slot nor wrote offsets.
func (d *Debezium) startOnFreePort(ctx context.Context) error {
	return onFreePort(ctx, &d.port, func() error {
		if err := d.writeConfigs(); err != nil {
			return err
		}
		return d.Start(ctx)
	}, d.restBindFailed)
}

// restBindFailed reports whether the worker's last start exited because
// its REST port was taken: Connect 4.3 (Jetty 12) stops with
// "ConnectException: Unable to initialize REST server", caused by
// "java.io.IOException: Failed to bind to /127.0.0.1:PORT", caused by
// "java.net.BindException: Address already in use". It reads the worker's
// own output, not the log file, which keeps earlier starts'.
func (d *Debezium) restBindFailed(error) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return false
	}
	log := d.proc.Log()
	return strings.Contains(log, "Unable to initialize REST server") && strings.Contains(log, "Address already in use")
}

// DebeziumForTest is StartDebezium for one test: closed when it ends, with
// the worker's log tail in the output of a failed test.
func DebeziumForTest(t testing.TB, opts DebeziumOptions) *Debezium {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := StartDebezium(ctx, opts)
	if err != nil {
		t.Fatalf("starting debezium: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kafka connect log tail (%s):\n%s", d.LogFile(), fileTail(d.LogFile(), 8<<10))
		}
		d.Close()
	})
	return d
}

// writeConfigs writes the worker's properties, its REST listener on d.port,
// and the connector's.
func (d *Debezium) writeConfigs() error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	cfg, err := pgconn.ParseConfig(d.opts.DSN)
	if err != nil {
		return fmt.Errorf("debezium: parsing the DSN: %w", err)
	}
	worker := map[string]string{
		"bootstrap.servers":            strings.Join(d.opts.Brokers, ","),
		"listeners":                    fmt.Sprintf("http://127.0.0.1:%d", d.port),
		"rest.advertised.host.name":    "127.0.0.1",
		"offset.storage.file.filename": filepath.Join(d.dir, "offsets.dat"),
		"plugin.discovery":             "only_scan",
	}
	for k, v := range d.opts.Worker {
		worker[k] = v
	}
	conn := map[string]string{
		"database.hostname": cfg.Host,
		"database.port":     strconv.Itoa(int(cfg.Port)),
		"database.user":     cfg.User,
		"database.password": cfg.Password,
		"database.dbname":   cfg.Database,
		"slot.name":         d.opts.Slot,
		"publication.name":  d.opts.Publication,
	}
	if len(d.opts.Tables) > 0 {
		conn["table.include.list"] = strings.Join(d.opts.Tables, ",")
	}
	for k, v := range d.opts.Connector {
		conn[k] = v
	}
	if err := appendProps(filepath.Join(root, "test", "debezium", "worker.properties"), d.workerPath(), worker); err != nil {
		return err
	}
	return appendProps(filepath.Join(root, "test", "debezium", "connector.properties"), d.connectorPath(), conn)
}

// appendProps copies base to dst and appends over (the last value of a key
// wins in a properties file).
func appendProps(base, dst string, over map[string]string) error {
	b, err := os.ReadFile(base)
	if err != nil {
		return fmt.Errorf("debezium: %w", err)
	}
	keys := make([]string, 0, len(over))
	for k := range over {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	sb.Write(b)
	sb.WriteString("\n# test overrides\n")
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s=%s\n", k, propEscape(over[k]))
	}
	if err := os.WriteFile(dst, []byte(sb.String()), 0o600); err != nil {
		return fmt.Errorf("debezium: %w", err)
	}
	return nil
}

// propEscape escapes a value for java.util.Properties: backslashes (a
// regex's \d) and a leading blank.
func propEscape(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	if strings.HasPrefix(v, " ") {
		v = `\` + v
	}
	return v
}

func (d *Debezium) workerPath() string    { return filepath.Join(d.dir, "worker.properties") }
func (d *Debezium) connectorPath() string { return filepath.Join(d.dir, "connector.properties") }

// debeziumLog4j: INFO for Connect and Debezium, the clients at WARN.
const debeziumLog4j = `status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = STDOUT
logger.cl.name = org.apache.kafka.clients
logger.cl.level = warn
logger.cfg.name = org.apache.kafka.common.config
logger.cfg.level = warn
`

// Start starts the worker (again, after Stop or Kill: same offsets file)
// and waits until the connector's task is RUNNING and holds the slot.
func (d *Debezium) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil && !d.proc.Exited() {
		return nil
	}
	logCfg := filepath.Join(d.dir, "log4j2.properties")
	if err := os.WriteFile(logCfg, []byte(debeziumLog4j), 0o644); err != nil {
		return fmt.Errorf("debezium: %w", err)
	}
	args := append([]string(nil), jvmFlags...)
	if d.opts.JVM != nil {
		args = append([]string(nil), d.opts.JVM...)
	}
	for _, p := range d.opts.SystemProperties {
		args = append(args, "-D"+p)
	}
	cp := filepath.Join(d.libs, "*")
	for _, dir := range []string{d.otelLibs, d.convLibs} {
		if dir != "" {
			cp += string(os.PathListSeparator) + filepath.Join(dir, "*")
		}
	}
	args = append(args, "-Dlog4j2.configurationFile="+logCfg, "-cp", cp,
		"org.apache.kafka.connect.cli.ConnectStandalone", d.workerPath(), d.connectorPath())
	proc, err := StartProc(ctx, "connect", "java", args, d.opts.Env, d.dir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(d.dir, "connect.pid"), []byte(strconv.Itoa(proc.Pid())), 0o644); err != nil {
		_ = proc.Kill()
		return fmt.Errorf("debezium: %w", err)
	}
	d.proc = proc
	if err := d.waitRunning(ctx, proc); err != nil {
		return err
	}
	return d.waitSlotActive(ctx, proc)
}

// connectorStatus is GET /connectors/<name>/status.
type connectorStatus struct {
	Connector struct {
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"connector"`
	Tasks []struct {
		ID    int    `json:"id"`
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"tasks"`
}

// Status returns the connector's and its first task's state ("RUNNING",
// "FAILED", ...; "" while Connect has not registered them).
func (d *Debezium) Status(ctx context.Context) (connector, task, trace string, err error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, d.RESTURL()+"/connectors/"+connectorName+"/status", nil)
	if err != nil {
		return "", "", "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", "", "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode == http.StatusNotFound {
		return "", "", "", nil
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", "", fmt.Errorf("connect REST: %s: %s", resp.Status, body)
	}
	var st connectorStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return "", "", "", fmt.Errorf("connect REST: %w", err)
	}
	if len(st.Tasks) > 0 {
		task, trace = st.Tasks[0].State, st.Tasks[0].Trace
	}
	if st.Connector.Trace != "" && trace == "" {
		trace = st.Connector.Trace
	}
	return st.Connector.State, task, trace, nil
}

func (d *Debezium) waitRunning(ctx context.Context, proc *Proc) error {
	var last string
	for {
		conn, task, trace, err := d.Status(ctx)
		switch {
		case err != nil:
			last = err.Error()
		case task == "FAILED" || conn == "FAILED":
			return fmt.Errorf("debezium connector failed: %s\nlog tail:\n%s", tail(trace, 4096), fileTail(proc.LogPath(), 4096))
		case conn == "RUNNING" && task == "RUNNING":
			return nil
		default:
			last = "connector " + conn + ", task " + task
		}
		if proc.Exited() {
			code, _ := proc.Wait(ctx)
			return fmt.Errorf("kafka connect exited (code %d); log tail:\n%s", code, fileTail(proc.LogPath(), 6<<10))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("debezium not running: %w (last: %s); log tail:\n%s", ctx.Err(), last, fileTail(proc.LogPath(), 4096))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitSlotActive: a RUNNING task may still be connecting; events written
// once its walsender holds the slot are streamed.
func (d *Debezium) waitSlotActive(ctx context.Context, proc *Proc) error {
	conn, err := pgx.Connect(ctx, d.opts.DSN)
	if err != nil {
		return fmt.Errorf("debezium: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var active bool
		err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, d.opts.Slot).Scan(&active)
		if err == nil && active {
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("debezium: reading slot %s: %w", d.opts.Slot, err)
		}
		if _, task, trace, serr := d.Status(ctx); serr == nil && task == "FAILED" {
			return fmt.Errorf("debezium connector failed: %s", tail(trace, 4096))
		}
		if proc.Exited() {
			return fmt.Errorf("kafka connect exited; log tail:\n%s", fileTail(proc.LogPath(), 6<<10))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("debezium never took slot %s: %w; log tail:\n%s", d.opts.Slot, ctx.Err(), fileTail(proc.LogPath(), 4096))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// RESTURL is the Connect REST API's base URL.
func (d *Debezium) RESTURL() string { return fmt.Sprintf("http://127.0.0.1:%d", d.port) }

// LogFile is the Connect worker's output.
func (d *Debezium) LogFile() string { return filepath.Join(d.dir, "connect.log") }

// OffsetsFile is where the standalone worker keeps its source offsets.
func (d *Debezium) OffsetsFile() string { return filepath.Join(d.dir, "offsets.dat") }

// Pid is the JVM's process id (0 when not running), for CPU and RSS figures.
func (d *Debezium) Pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil || d.proc.Exited() {
		return 0
	}
	return d.proc.Pid()
}

// Stop shuts the worker down gracefully (SIGTERM: Connect stops the task,
// flushes the producer, commits the offsets, and Debezium confirms them to
// the slot), waiting up to two minutes before it kills.
func (d *Debezium) Stop() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return nil
	}
	proc := d.proc
	d.proc = nil
	return stopJVM(proc)
}

// Kill SIGKILLs the worker: no offset commit.
func (d *Debezium) Kill() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return nil
	}
	proc := d.proc
	d.proc = nil
	return proc.Kill()
}

// Close kills the worker and removes its dir. It never fails.
func (d *Debezium) Close() {
	_ = d.Kill()
	_ = os.RemoveAll(d.dir)
	d.reaper.close()
}

func (d *Debezium) startReaper() (err error) {
	d.reaper, err = startJVMReaper("outboxd-debezium-reaper", d.dir)
	return err
}

// Alive is nil while the worker runs and its connector and task are not
// FAILED; otherwise it says what happened, with the failure's stack trace.
func (d *Debezium) Alive() error {
	d.mu.Lock()
	proc := d.proc
	d.mu.Unlock()
	if proc == nil || proc.Exited() {
		return fmt.Errorf("kafka connect is not running; log tail:\n%s", fileTail(d.LogFile(), 4096))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, task, trace, err := d.Status(ctx)
	if err != nil {
		return nil // the REST API being slow is not a failure
	}
	if conn == "FAILED" || task == "FAILED" {
		return fmt.Errorf("debezium connector %s, task %s: %s", conn, task, tail(trace, 4096))
	}
	return nil
}
