// Package deploy_test checks that the deployment files in deploy/ agree with
// the outboxd binary and with each other: every OUTBOXD_* variable and --flag
// they mention is an option of an outboxd command (run, setup, status, slot
// drop) or a listed flag of another tool, every outboxd_* metric exists in
// metrics.go, ports are 9187, probes hit /healthz and /readyz, the
// compose init SQL is the rendered migrations, and every alert has unit tests.
//
//	go test ./deploy/
//	go test ./deploy/ -run TestComposeInitSQL -update   # re-render compose/init.sql
//
// Options announced but not yet implemented (see pendingOptions) fail with a
// message saying so; DEPLOY_TEST_ALLOW_PENDING=1 skips them instead.
// DEPLOY_TEST_BINARY=/path/to/outboxd checks a prebuilt binary's options
// instead of building ../cmd/outboxd.
package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/migrations"
)

var update = flag.Bool("update", false, "rewrite compose/init.sql from migrations/*.sql.tmpl")

// pendingOptions are options the deploy files may already reference, announced
// for upcoming releases. Until `outboxd run --help` lists them, they are
// reported as pending (a failure, or a skip with DEPLOY_TEST_ALLOW_PENDING=1).
var pendingOptions = map[string]string{
	"on-invalid":               "invalid-row policy (fail|dead-letter)",
	"dead-letter-topic":        "dead-letter topic (default outboxd.deadletter)",
	"kafka-tls-ca":             "Kafka TLS",
	"kafka-tls-cert":           "Kafka TLS",
	"kafka-tls-key":            "Kafka TLS",
	"kafka-sasl-mechanism":     "Kafka SASL",
	"kafka-sasl-user":          "Kafka SASL",
	"kafka-sasl-password-file": "Kafka SASL",
	// Not a flag: the SASL password's environment variable.
	"env:OUTBOXD_KAFKA_SASL_PASSWORD": "Kafka SASL (password from the environment)",
}

// foreignFlags are --flags of other tools that the deploy files mention.
// Anything else spelled --name must be an outboxd option.
var foreignFlags = map[string]string{
	"help":             "every command",
	"platform":         "Dockerfile FROM, docker buildx build",
	"mount":            "Dockerfile RUN",
	"from":             "Dockerfile COPY",
	"build-arg":        "docker build",
	"rm":               "docker run",
	"build":            "docker compose up",
	"volumes":          "docker compose down",
	"tags":             "git describe",
	"always":           "git describe",
	"bootstrap-server": "Kafka CLI tools",
	"topic":            "Kafka CLI tools",
	"from-beginning":   "Kafka CLI tools",
	"max-messages":     "Kafka CLI tools",
	"property":         "Kafka CLI tools",
	"from-literal":     "kubectl create secret",
	"from-file":        "kubectl create secret",
	"bridge":           "dockerd (.ci/docker.sh)",
	"iptables":         "dockerd (.ci/docker.sh)",
}

const (
	port         = "9187"
	demoRole     = "outboxd"
	demoPassword = "outboxd"
)

var (
	binOpts   map[string]string   // option name -> env var, from `outboxd run --help`
	binHelp   string              // the whole `outboxd run --help` text
	otherOpts map[string][]string // options of the other commands -> the commands
	otherHelp string              // their help texts
	binErr    error
	deployDir string
)

func TestMain(m *testing.M) {
	flag.Parse()
	var err error
	if deployDir, err = os.Getwd(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	tmp, err := os.MkdirTemp("", "outboxd-deploy-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binErr = buildAndReadOptions(tmp)
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

var helpLine = regexp.MustCompile(`(?m)^  --([a-z0-9][a-z0-9.-]*)  \[(OUTBOXD_[A-Z0-9_]+)\]`)

// buildAndReadOptions builds cmd/outboxd once and parses `run --help`, and
// the help of the other commands (setup, status, slot drop) where they have one.
func buildAndReadOptions(tmp string) error {
	bin := os.Getenv("DEPLOY_TEST_BINARY") // a prebuilt outboxd, instead of building ../cmd/outboxd
	if bin == "" {
		goBin, err := exec.LookPath("go")
		if err != nil {
			return err
		}
		bin = filepath.Join(tmp, "outboxd")
		build := exec.Command(goBin, "build", "-o", bin, "../cmd/outboxd")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ../cmd/outboxd: %v\n%s", err, out)
		}
	}
	help := func(args ...string) (string, map[string]string, error) {
		cmd := exec.Command(bin, append(args, "--help")...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Env = []string{} // no OUTBOXD_* from the caller
		if err := cmd.Run(); err != nil {
			return "", nil, fmt.Errorf("outboxd %s --help: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		opts := map[string]string{}
		for _, m := range helpLine.FindAllStringSubmatch(stdout.String(), -1) {
			opts[m[1]] = m[2]
		}
		return stdout.String(), opts, nil
	}
	var err error
	if binHelp, binOpts, err = help("run"); err != nil {
		return err
	}
	if len(binOpts) == 0 {
		return fmt.Errorf("no option lines in `outboxd run --help`:\n%s", binHelp)
	}
	otherOpts = map[string][]string{}
	for _, c := range [][]string{{"setup"}, {"status"}, {"slot", "drop"}} {
		text, opts, err := help(c...)
		if err != nil {
			continue // a command this build does not have yet
		}
		otherHelp += text
		for o := range opts {
			otherOpts[o] = append(otherOpts[o], strings.Join(c, " "))
		}
	}
	return nil
}

func needBinary(t *testing.T) {
	t.Helper()
	if binErr != nil {
		t.Fatalf("cannot read outboxd's options: %v", binErr)
	}
}

// --- reading deploy files ---------------------------------------------------

// deployFiles returns every file under deploy/ except Go sources, as
// slash-separated paths relative to deploy/.
func deployFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(deployDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || strings.HasSuffix(p, ".go") {
			return nil
		}
		rel, err := filepath.Rel(deployDir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func read(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readYAML(t *testing.T, rel string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(read(t, rel), &m); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	if m == nil {
		t.Fatalf("%s: empty", rel)
	}
	return m
}

// get walks maps (string keys) and lists (int keys); nil if absent.
func get(v any, path ...any) any {
	for _, k := range path {
		switch k := k.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func list(v any) []any { l, _ := v.([]any); return l }

func mapOf(v any) map[string]any { m, _ := v.(map[string]any); return m }

// ref is one mention of a name in a deploy file.
type ref struct {
	file string
	line int
	text string // as written: --flag or OUTBOXD_NAME
}

func (r ref) String() string { return fmt.Sprintf("%s:%d (%s)", r.file, r.line, r.text) }

func lineOf(b []byte, off int) int { return bytes.Count(b[:off], []byte("\n")) + 1 }

var (
	envRE    = regexp.MustCompile(`\bOUTBOXD_[A-Z0-9_]*[A-Z0-9]\b`)
	flagRE   = regexp.MustCompile(`(?:^|[^A-Za-z0-9_-])--([a-z][a-z0-9.-]*[a-z0-9])`)
	metricRE = regexp.MustCompile(`\boutboxd_[a-z0-9][a-z0-9_]*[a-z0-9]\b`)
)

// --- options ----------------------------------------------------------------

// TestOptionReferences: every OUTBOXD_* variable and every --flag in deploy/
// is an option of `outboxd run` or another outboxd command (or a known flag
// of another tool); every key of the README's --config examples is an option
// of `outboxd run`.
func TestOptionReferences(t *testing.T) {
	needBinary(t)
	knownEnv := map[string]bool{}
	for _, e := range envRE.FindAllString(binHelp+otherHelp, -1) {
		knownEnv[e] = true // includes env-only variables the help text names
	}
	knownEnv["OUTBOXD_SKIP_DOCKER_TESTS"] = true // test/docker's, not outboxd's
	knownEnv["OUTBOXD_TEST_BACKEND"] = true      // the test harness's
	byOption := map[string][]ref{}
	for _, f := range deployFiles(t) {
		b := read(t, f)
		for _, loc := range envRE.FindAllIndex(b, -1) {
			name := string(b[loc[0]:loc[1]])
			r := ref{f, lineOf(b, loc[0]), name}
			if knownEnv[name] {
				continue
			}
			opt := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "OUTBOXD_")), "_", "-")
			if _, isFlag := pendingOptions[opt]; !isFlag {
				if _, envOnly := pendingOptions["env:"+name]; envOnly {
					opt = "env:" + name
				}
			}
			byOption[opt] = append(byOption[opt], r)
		}
		for _, m := range flagRE.FindAllSubmatchIndex(b, -1) {
			name := string(b[m[2]:m[3]])
			if _, ok := binOpts[name]; ok {
				continue
			}
			if _, ok := otherOpts[name]; ok {
				continue
			}
			if _, ok := foreignFlags[name]; ok {
				continue
			}
			byOption[name] = append(byOption[name], ref{f, lineOf(b, m[2]), "--" + name})
		}
	}
	// Keys of the --config examples in the README (```yaml blocks).
	readme := read(t, "README.md")
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatchIndex(readme, -1) {
		var tree map[string]any
		if err := yaml.Unmarshal(readme[m[2]:m[3]], &tree); err != nil {
			t.Errorf("README.md:%d: yaml block: %v", lineOf(readme, m[2]), err)
			continue
		}
		for _, key := range configKeys("", tree) {
			name := strings.ReplaceAll(key, ".", "-")
			if _, ok := binOpts[name]; !ok {
				byOption[name] = append(byOption[name], ref{"README.md", lineOf(readme, m[2]), "config key " + key})
			}
		}
	}
	names := make([]string, 0, len(byOption))
	for n := range byOption {
		names = append(names, n)
	}
	sort.Strings(names)
	var pending []string
	for _, n := range names {
		refs := byOption[n]
		sort.Slice(refs, func(i, j int) bool {
			if refs[i].file != refs[j].file {
				return refs[i].file < refs[j].file
			}
			return refs[i].line < refs[j].line
		})
		t.Run(strings.ReplaceAll(n, "/", "_"), func(t *testing.T) {
			where := make([]string, len(refs))
			for i, r := range refs {
				where[i] = r.String()
			}
			if why, ok := pendingOptions[n]; ok {
				pending = append(pending, n)
				msg := fmt.Sprintf("PENDING option %s (%s): referenced by deploy/ but not yet in `outboxd run --help`:\n  %s",
					n, why, strings.Join(where, "\n  "))
				if os.Getenv("DEPLOY_TEST_ALLOW_PENDING") != "" {
					t.Skip(msg)
				}
				t.Error(msg)
				return
			}
			t.Errorf("UNKNOWN option %s: not an option of `outboxd run` (nor a known flag of another tool in foreignFlags):\n  %s",
				n, strings.Join(where, "\n  "))
		})
	}
	if len(pending) > 0 {
		t.Logf("pending options (announced, not in the binary yet): %s", strings.Join(pending, ", "))
	}
}

// configKeys flattens a --config tree into dotted keys, as outboxd does; the
// router's sections (router, tables) are not options.
func configKeys(prefix string, tree map[string]any) []string {
	var keys []string
	for k, v := range tree {
		if prefix == "" && (k == "router" || k == "tables") {
			continue
		}
		if sub, ok := v.(map[string]any); ok {
			keys = append(keys, configKeys(prefix+k+".", sub)...)
			continue
		}
		keys = append(keys, prefix+k)
	}
	return keys
}

// --- metrics ----------------------------------------------------------------

var histogramRE = regexp.MustCompile(`(?s)HistogramOpts\{[^}]*?Name:\s*"(outboxd_[a-z0-9_]+)"`)

// binaryMetrics reads metric names from metrics.go (the root package).
func binaryMetrics(t *testing.T) (names, histograms map[string]bool) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(deployDir, "..", "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	names, histograms = map[string]bool{}, map[string]bool{}
	for _, m := range regexp.MustCompile(`"(outboxd_[a-z0-9_]+)"`).FindAllStringSubmatch(string(src), -1) {
		names[m[1]] = true
	}
	for _, m := range histogramRE.FindAllStringSubmatch(string(src), -1) {
		histograms[m[1]] = true
	}
	if len(names) < 10 {
		t.Fatalf("found only %d metric names in metrics.go: has its layout changed?", len(names))
	}
	return names, histograms
}

// TestMetricReferences: every outboxd_* name in deploy/ (alerts, their tests,
// the dashboard, the README) is a metric of the binary.
func TestMetricReferences(t *testing.T) {
	names, histograms := binaryMetrics(t)
	known := func(n string) bool {
		if names[n] {
			return true
		}
		for _, suf := range []string{"_bucket", "_count", "_sum"} {
			if base, ok := strings.CutSuffix(n, suf); ok && histograms[base] {
				return true
			}
		}
		return false
	}
	missing := map[string][]string{}
	for _, f := range deployFiles(t) {
		b := read(t, f)
		for _, loc := range metricRE.FindAllIndex(b, -1) {
			n := string(b[loc[0]:loc[1]])
			if !known(n) {
				missing[n] = append(missing[n], fmt.Sprintf("%s:%d", f, lineOf(b, loc[0])))
			}
		}
	}
	keys := make([]string, 0, len(missing))
	for k := range missing {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Errorf("metric %s is not in metrics.go; referenced at %s", k, strings.Join(missing[k], ", "))
	}
}

// --- compose ----------------------------------------------------------------

func TestCompose(t *testing.T) {
	c := readYAML(t, "compose.yaml")
	svcs := mapOf(c["services"])
	for _, s := range []string{"postgres", "kafka", "outboxd", "prometheus", "grafana"} {
		if svcs[s] == nil {
			t.Errorf("compose.yaml: no service %q", s)
		}
	}
	pg, kafka, ob := svcs["postgres"], svcs["kafka"], svcs["outboxd"]

	if img := str(get(pg, "image")); img != "postgres:16" {
		t.Errorf("postgres image %q, want postgres:16", img)
	}
	cmd := str(get(pg, "command"))
	for _, want := range []string{"wal_level=logical", "max_replication_slots=", "max_wal_senders=", "max_slot_wal_keep_size="} {
		if !strings.Contains(cmd, want) {
			t.Errorf("postgres command %q lacks %s", cmd, want)
		}
	}
	if !slices.ContainsFunc(list(get(pg, "volumes")), func(v any) bool {
		return strings.HasPrefix(str(v), "./compose/init.sql:/docker-entrypoint-initdb.d/")
	}) {
		t.Error("postgres does not mount ./compose/init.sql into /docker-entrypoint-initdb.d/")
	}
	if img := str(get(kafka, "image")); img != "apache/kafka:3.9.0" {
		t.Errorf("kafka image %q, want apache/kafka:3.9.0", img)
	}
	if str(get(kafka, "environment", "KAFKA_PROCESS_ROLES")) != "broker,controller" {
		t.Error("kafka is not a combined KRaft broker,controller node")
	}

	// outboxd: built from deploy/Dockerfile with the repository as context.
	if get(ob, "build", "context") != ".." || get(ob, "build", "dockerfile") != "deploy/Dockerfile" {
		t.Errorf("outboxd build = %v, want context .. and dockerfile deploy/Dockerfile", get(ob, "build"))
	}
	// On the host's loopback only: the endpoints have no authentication.
	if !slices.ContainsFunc(list(get(ob, "ports")), func(v any) bool { return str(v) == "127.0.0.1:"+port+":"+port }) {
		t.Errorf("outboxd does not publish 127.0.0.1:%s:%s", port, port)
	}
	env := mapOf(get(ob, "environment"))
	for k := range env {
		if !strings.HasPrefix(k, "OUTBOXD_") {
			t.Errorf("outboxd environment %s: only OUTBOXD_* variables configure outboxd", k)
		}
	}
	if a := str(env["OUTBOXD_HTTP_ADDR"]); a != "" && a != ":"+port {
		t.Errorf("OUTBOXD_HTTP_ADDR %q, want :%s", a, port)
	}
	for dep, cond := range map[string]string{"postgres": "service_healthy", "kafka": "service_healthy"} {
		if got := str(get(ob, "depends_on", dep, "condition")); got != cond {
			t.Errorf("outboxd depends_on %s condition %q, want %s", dep, got, cond)
		}
	}
	// Every service_healthy dependency has a healthcheck.
	for name, s := range svcs {
		for dep, d := range mapOf(get(s, "depends_on")) {
			if str(get(d, "condition")) == "service_healthy" && get(svcs[dep], "healthcheck") == nil {
				t.Errorf("%s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
			}
		}
	}
	// Grace period covers the shutdown timeout.
	grace := mustDuration(t, str(get(ob, "stop_grace_period")), "outboxd stop_grace_period")
	shutdown := shutdownTimeout(t, str(env["OUTBOXD_SHUTDOWN_TIMEOUT"]))
	if grace <= shutdown {
		t.Errorf("outboxd stop_grace_period %v must exceed the shutdown timeout %v", grace, shutdown)
	}

	// The DSN logs in as the role init.sql creates, to the database the image creates.
	dsn, err := url.Parse(str(env["OUTBOXD_POSTGRES"]))
	if err != nil {
		t.Fatalf("OUTBOXD_POSTGRES: %v", err)
	}
	pw, _ := dsn.User.Password()
	if dsn.User.Username() != demoRole || pw != demoPassword || dsn.Hostname() != "postgres" {
		t.Errorf("OUTBOXD_POSTGRES %q: want user %s, password %s, host postgres", dsn.Redacted(), demoRole, demoPassword)
	}
	if db := strings.TrimPrefix(dsn.Path, "/"); db != str(get(pg, "environment", "POSTGRES_DB")) {
		t.Errorf("OUTBOXD_POSTGRES database %q != postgres POSTGRES_DB %q", db, str(get(pg, "environment", "POSTGRES_DB")))
	}
	// Brokers are advertised to containers under that address.
	adv := str(get(kafka, "environment", "KAFKA_ADVERTISED_LISTENERS"))
	for _, b := range strings.Split(str(env["OUTBOXD_KAFKA_BROKERS"]), ",") {
		if !strings.Contains(adv, "://"+b) {
			t.Errorf("OUTBOXD_KAFKA_BROKERS %q is not among kafka's advertised listeners %q", b, adv)
		}
	}

	// Bind mounts exist.
	for name, s := range svcs {
		for _, v := range list(get(s, "volumes")) {
			src := strings.SplitN(str(v), ":", 2)[0]
			if strings.HasPrefix(src, "./") {
				if _, err := os.Stat(filepath.Join(deployDir, filepath.FromSlash(src))); err != nil {
					t.Errorf("%s mounts %s: %v", name, src, err)
				}
			}
		}
	}
	mounts := func(svc, src string) string {
		for _, v := range list(get(svcs[svc], "volumes")) {
			parts := strings.Split(str(v), ":")
			if len(parts) >= 2 && parts[0] == src {
				return parts[1]
			}
		}
		t.Errorf("%s does not mount %s", svc, src)
		return ""
	}
	// Prometheus: config and the rule file it names, side by side.
	promCfg := mounts("prometheus", "./prometheus/prometheus.yml")
	rules := mounts("prometheus", "./prometheus/alerts.yaml")
	if promCfg != "/etc/prometheus/prometheus.yml" {
		t.Errorf("prometheus.yml mounted at %s; the image reads /etc/prometheus/prometheus.yml", promCfg)
	}
	if rules != "" && path2dir(rules) != path2dir(promCfg) {
		t.Errorf("alerts.yaml (%s) is not next to prometheus.yml (%s), where rule_files looks", rules, promCfg)
	}
	// Grafana: the dashboard lands where the provider looks.
	dash := mounts("grafana", "./grafana/outboxd.json")
	prov := readYAML(t, "grafana/provisioning/dashboards/outboxd.yaml")
	if p := str(get(prov, "providers", 0, "options", "path")); dash != "" && path2dir(dash) != p {
		t.Errorf("dashboard mounted at %s, provider reads %s", dash, p)
	}
	mounts("grafana", "./grafana/provisioning/datasources")
	mounts("grafana", "./grafana/provisioning/dashboards")
	ds := readYAML(t, "grafana/provisioning/datasources/prometheus.yaml")
	if u := str(get(ds, "datasources", 0, "url")); u != "http://prometheus:9090" {
		t.Errorf("grafana datasource url %q, want http://prometheus:9090", u)
	}
}

func path2dir(p string) string { return strings.TrimSuffix(p[:strings.LastIndex(p, "/")+1], "/") }

func mustDuration(t *testing.T, s, what string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s %q: %v", what, s, err)
	}
	return d
}

// shutdownTimeout is the configured value, or the binary's default.
func shutdownTimeout(t *testing.T, configured string) time.Duration {
	t.Helper()
	if configured != "" {
		return mustDuration(t, configured, "OUTBOXD_SHUTDOWN_TIMEOUT")
	}
	m := regexp.MustCompile(`--shutdown-timeout  \[OUTBOXD_SHUTDOWN_TIMEOUT\] \(default ([^)]+)\)`).FindStringSubmatch(binHelp)
	if m == nil {
		return 30 * time.Second
	}
	return mustDuration(t, m[1], "default --shutdown-timeout")
}

// renderInitSQL is compose/init.sql: the migrations for public.outbox,
// publication outboxd and role outboxd, plus the demo password.
func renderInitSQL() (string, error) {
	vars := migrations.Vars{Table: "public.outbox", Schema: "public", Publication: "outboxd", Role: demoRole}
	var b strings.Builder
	b.WriteString(`-- GENERATED from migrations/*.sql.tmpl by
--   go test ./deploy/ -run TestComposeInitSQL -update
-- Do not edit by hand. Table public.outbox, publication outboxd, role outboxd.
-- The postgres image runs this once, on an empty data volume, as the
-- superuser in POSTGRES_DB (deploy/compose.yaml).
`)
	for _, name := range []string{migrations.OutboxTable, migrations.Publication, migrations.Role} {
		sql, err := migrations.Render(name, vars)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\n-- ===== migrations/%s =====\n%s", name, strings.TrimRight(sql, "\n")+"\n")
	}
	fmt.Fprintf(&b, "\n-- Demo password only. In production set it out of band (deploy/README.md).\nALTER ROLE %s PASSWORD '%s';\n", demoRole, demoPassword)
	return b.String(), nil
}

func TestComposeInitSQL(t *testing.T) {
	want, err := renderInitSQL()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(deployDir, "compose", "init.sql")
	if *update {
		if err := os.WriteFile(p, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("compose/init.sql differs from the rendered migrations; run: go test ./deploy/ -run TestComposeInitSQL -update")
	}
}

// --- Dockerfile ---------------------------------------------------------------

func TestDockerfile(t *testing.T) {
	d := string(read(t, "Dockerfile"))
	for _, re := range []string{
		`(?m)^ARG BUILDER_IMAGE=golang:\$\{GO_VERSION\}$`,
		`(?m)^FROM --platform=\$BUILDPLATFORM \$\{BUILDER_IMAGE\} AS build$`,
		`(?m)^ARG RUNTIME_IMAGE=gcr\.io/distroless/static-debian12:nonroot$`,
		`(?m)^FROM \$\{RUNTIME_IMAGE\}$`,
		`(?m)^ARG GO_VERSION=1\.26$`,
		`CGO_ENABLED=0`,
		`go build -trimpath -ldflags "-s -w -X main\.version=\$\{VERSION\}"`,
		`(?m)^USER 65532:65532$`,
		`(?m)^EXPOSE ` + port + `$`,
		`(?m)^ENV OUTBOXD_HTTP_ADDR=:` + port + `$`, // the binary's default is loopback
		`(?m)^ENTRYPOINT \["/outboxd"\]$`,
		`(?m)^CMD \["run"\]$`,
		`docker build -f deploy/Dockerfile`,
	} {
		if !regexp.MustCompile(re).MatchString(d) {
			t.Errorf("Dockerfile does not match %s", re)
		}
	}
	main, err := os.ReadFile(filepath.Join(deployDir, "..", "cmd", "outboxd", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^var version = `).Match(main) {
		t.Error("cmd/outboxd/main.go has no `var version`: -X main.version would set nothing")
	}
}

// --- Kubernetes -----------------------------------------------------------------

func TestKubernetes(t *testing.T) {
	k := readYAML(t, "kubernetes/kustomization.yaml")
	var resources []string
	for _, r := range list(k["resources"]) {
		resources = append(resources, str(r))
		if _, err := os.Stat(filepath.Join(deployDir, "kubernetes", str(r))); err != nil {
			t.Errorf("kustomization resource %s: %v", r, err)
		}
	}
	entries, err := os.ReadDir(filepath.Join(deployDir, "kubernetes"))
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]map[string]any{}
	for _, e := range entries {
		n := e.Name()
		if !strings.HasSuffix(n, ".yaml") {
			continue
		}
		docs[n] = readYAML(t, "kubernetes/"+n)
		switch n {
		case "kustomization.yaml":
		case "secret.example.yaml":
			if slices.Contains(resources, n) {
				t.Error("kustomization lists secret.example.yaml: `kubectl apply -k` would overwrite the real Secret with placeholders")
			}
		default:
			if !slices.Contains(resources, n) {
				t.Errorf("kustomization does not list %s", n)
			}
		}
	}
	for _, n := range []string{"deployment.yaml", "service.yaml", "configmap.yaml", "secret.example.yaml", "servicemonitor.yaml", "pdb.yaml"} {
		if docs[n] == nil {
			t.Fatalf("kubernetes/%s missing", n)
		}
	}
	dep, svc, cm, sec, sm, pdb := docs["deployment.yaml"], docs["service.yaml"], docs["configmap.yaml"], docs["secret.example.yaml"], docs["servicemonitor.yaml"], docs["pdb.yaml"]

	spec := get(dep, "spec")
	if n, _ := get(spec, "replicas").(int); n != 2 {
		t.Errorf("deployment replicas %v, want 2 (an active and a standby)", get(spec, "replicas"))
	}
	if s := str(get(spec, "strategy", "type")); s != "RollingUpdate" || str(get(spec, "strategy", "rollingUpdate", "maxUnavailable")) != "0" {
		t.Errorf("deployment strategy %v, want RollingUpdate with maxUnavailable 0 (a standby is up before the active stops)", get(spec, "strategy"))
	}
	podLabels := mapOf(get(spec, "template", "metadata", "labels"))
	pod := get(spec, "template", "spec")
	if get(pod, "enableServiceLinks") != false {
		t.Error("enableServiceLinks must be false: service links inject OUTBOXD_* variables for the outboxd Service")
	}
	if get(pod, "securityContext", "runAsNonRoot") != true {
		t.Error("pod securityContext.runAsNonRoot is not true")
	}
	var c any
	for _, x := range list(get(pod, "containers")) {
		if get(x, "name") == "outboxd" {
			c = x
		}
	}
	if c == nil {
		t.Fatal("no container named outboxd")
	}
	if get(c, "securityContext", "readOnlyRootFilesystem") != true || get(c, "securityContext", "allowPrivilegeEscalation") != false {
		t.Error("container securityContext: want readOnlyRootFilesystem true and allowPrivilegeEscalation false")
	}
	if str(get(c, "ports", 0, "name")) != "http-metrics" || str(get(c, "ports", 0, "containerPort")) != port {
		t.Errorf("container port %v, want http-metrics %s", get(c, "ports"), port)
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if got := str(get(c, probe, "httpGet", "path")); got != path {
			t.Errorf("%s path %q, want %s", probe, got, path)
		}
		if p := str(get(c, probe, "httpGet", "port")); p != "http-metrics" && p != port {
			t.Errorf("%s port %q, want http-metrics or %s", probe, p, port)
		}
	}
	if get(c, "resources", "requests", "memory") == nil || get(c, "resources", "limits", "memory") == nil {
		t.Error("container needs memory requests and limits")
	}
	// Configuration: the ConfigMap and the Secret the Deployment reads exist.
	if n := str(get(c, "envFrom", 0, "configMapRef", "name")); n != str(get(cm, "metadata", "name")) {
		t.Errorf("envFrom configMapRef %q, ConfigMap is %q", n, str(get(cm, "metadata", "name")))
	}
	secretKeys := mapOf(get(sec, "stringData"))
	for _, e := range list(get(c, "env")) {
		if ref := get(e, "valueFrom", "secretKeyRef"); ref != nil {
			if str(get(ref, "name")) != str(get(sec, "metadata", "name")) {
				t.Errorf("env %s reads Secret %q, the example is %q", get(e, "name"), get(ref, "name"), get(sec, "metadata", "name"))
			}
			if _, ok := secretKeys[str(get(ref, "key"))]; !ok {
				t.Errorf("env %s reads key %q, not in secret.example.yaml", get(e, "name"), get(ref, "key"))
			}
		}
	}
	data := mapOf(get(cm, "data"))
	for k, v := range data {
		if !strings.HasPrefix(k, "OUTBOXD_") {
			t.Errorf("configmap key %s: only OUTBOXD_* variables configure outboxd", k)
		}
		if k == "OUTBOXD_HTTP_ADDR" && str(v) != ":"+port {
			t.Errorf("OUTBOXD_HTTP_ADDR %q, want :%s", v, port)
		}
	}
	grace, _ := get(pod, "terminationGracePeriodSeconds").(int)
	if shutdown := shutdownTimeout(t, str(data["OUTBOXD_SHUTDOWN_TIMEOUT"])); time.Duration(grace)*time.Second <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %d must exceed the shutdown timeout %v", grace, shutdown)
	}

	// Service, ServiceMonitor, PDB select the pods and name the port.
	selects := func(what string, sel map[string]any, labels map[string]any) {
		if len(sel) == 0 {
			t.Errorf("%s has an empty selector", what)
		}
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s selects %s=%v, which the target does not carry", what, k, v)
			}
		}
	}
	selects("service", mapOf(get(svc, "spec", "selector")), podLabels)
	if str(get(svc, "spec", "ports", 0, "port")) != port || str(get(svc, "spec", "ports", 0, "name")) != "http-metrics" {
		t.Errorf("service port %v, want %s named http-metrics", get(svc, "spec", "ports"), port)
	}
	if str(get(sm, "apiVersion")) != "monitoring.coreos.com/v1" || str(get(sm, "kind")) != "ServiceMonitor" {
		t.Error("servicemonitor.yaml is not a monitoring.coreos.com/v1 ServiceMonitor")
	}
	selects("servicemonitor", mapOf(get(sm, "spec", "selector", "matchLabels")), mapOf(get(svc, "metadata", "labels")))
	if p := str(get(sm, "spec", "endpoints", 0, "port")); p != "http-metrics" {
		t.Errorf("servicemonitor endpoint port %q, want http-metrics", p)
	}
	if str(get(sm, "spec", "endpoints", 0, "path")) != "/metrics" {
		t.Error("servicemonitor endpoint path is not /metrics")
	}
	selects("pdb", mapOf(get(pdb, "spec", "selector", "matchLabels")), podLabels)
	if str(get(pdb, "spec", "maxUnavailable")) != "1" || get(pdb, "spec", "minAvailable") != nil {
		t.Error("pdb: want maxUnavailable 1 and no minAvailable")
	}
}

// --- Prometheus -----------------------------------------------------------------

var requiredAlerts = []string{
	"OutboxdSlotLagHigh", "OutboxdSlotInactive", "OutboxdWALStatusUnreserved", "OutboxdBacklogStuck",
	"OutboxdBrokerUnreachable", "OutboxdProduceErrors", "OutboxdDeadLettered", "OutboxdDown",
}

func TestPrometheusConfig(t *testing.T) {
	p := readYAML(t, "prometheus/prometheus.yml")
	if !slices.ContainsFunc(list(p["rule_files"]), func(v any) bool { return str(v) == "alerts.yaml" }) {
		t.Error("prometheus.yml does not load alerts.yaml")
	}
	found := false
	for _, sc := range list(p["scrape_configs"]) {
		for _, sc2 := range list(get(sc, "static_configs")) {
			for _, tg := range list(get(sc2, "targets")) {
				if str(tg) == "outboxd:"+port {
					found = true
					if str(get(sc, "job_name")) != "outboxd" {
						t.Errorf("outboxd scraped by job %q; OutboxdDown matches job=\"outboxd\"", get(sc, "job_name"))
					}
				}
			}
		}
	}
	if !found {
		t.Errorf("prometheus.yml does not scrape outboxd:%s", port)
	}
}

// TestAlerts: the required alerts exist with summary and description, and
// alerts_test.yaml has a firing and a not-firing case for every alert.
func TestAlerts(t *testing.T) {
	a := readYAML(t, "prometheus/alerts.yaml")
	alerts := map[string]bool{}
	for _, g := range list(a["groups"]) {
		for _, r := range list(get(g, "rules")) {
			name := str(get(r, "alert"))
			if name == "" {
				continue
			}
			alerts[name] = true
			for _, ann := range []string{"summary", "description"} {
				if str(get(r, "annotations", ann)) == "" {
					t.Errorf("alert %s has no %s annotation", name, ann)
				}
			}
			if str(get(r, "labels", "severity")) == "" {
				t.Errorf("alert %s has no severity label", name)
			}
		}
	}
	for _, n := range requiredAlerts {
		if !alerts[n] {
			t.Errorf("alerts.yaml lacks %s", n)
		}
	}
	tests := readYAML(t, "prometheus/alerts_test.yaml")
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range list(tests["tests"]) {
		for _, at := range list(get(tc, "alert_rule_test")) {
			n := str(get(at, "alertname"))
			if !alerts[n] {
				t.Errorf("alerts_test.yaml tests unknown alert %s", n)
			}
			if len(list(get(at, "exp_alerts"))) > 0 {
				firing[n] = true
			} else {
				silent[n] = true
			}
		}
	}
	for n := range alerts {
		if !firing[n] {
			t.Errorf("alerts_test.yaml has no firing case for %s", n)
		}
		if !silent[n] {
			t.Errorf("alerts_test.yaml has no not-firing case for %s", n)
		}
	}
}

// TestPromtool runs deploy/check.sh's checks when promtool is installed.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (apt-get install prometheus); deploy/check.sh runs these checks")
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yaml"},
		{"check", "config", "prometheus.yml"},
		{"test", "rules", "alerts_test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = filepath.Join(deployDir, "prometheus")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// --- Grafana --------------------------------------------------------------------

type panel struct {
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func TestGrafanaDashboard(t *testing.T) {
	var d struct {
		UID        string  `json:"uid"`
		Title      string  `json:"title"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
				Type string `json:"type"`
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(bytes.NewReader(read(t, "grafana/outboxd.json")))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana/outboxd.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a uid and a title")
	}
	hasDS := slices.ContainsFunc(d.Templating.List, func(v struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource"
	})
	if !hasDS {
		t.Error("dashboard has no datasource variable named datasource")
	}
	var exprs []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			if !strings.Contains(string(p.Datasource), "${datasource}") {
				t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q has an empty query", p.Title)
				}
				exprs = append(exprs, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	all := strings.Join(exprs, "\n")
	for _, want := range []string{
		"outboxd_slot_lag_bytes", "outboxd_slot_retained_wal_bytes", "outboxd_slot_wal_status",
		"outboxd_slot_safe_wal_size_bytes", "rate(outboxd_events_published_total",
		"histogram_quantile(0.5, sum by (le) (rate(outboxd_publish_latency_seconds_bucket",
		"histogram_quantile(0.99, sum by (le) (rate(outboxd_publish_latency_seconds_bucket",
		"outboxd_inflight_events", "outboxd_inflight_bytes", "outboxd_oldest_unacked_age_seconds",
		"outboxd_reconnects_total", "outboxd_events_skipped_total", "outboxd_events_dead_lettered_total",
		"outboxd_kafka_produce_errors_total", "outboxd_replication_delay_seconds", "outboxd_replication_connected",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("dashboard has no query with %s", want)
		}
	}
}

// --- README -----------------------------------------------------------------------

func TestReadme(t *testing.T) {
	r := string(read(t, "README.md"))
	for _, want := range []string{
		"docker build -f deploy/Dockerfile .",
		"docker compose -f deploy/compose.yaml up",
		"kubectl apply -k deploy/kubernetes",
		"wal_level", "max_replication_slots", "max_wal_senders", "max_slot_wal_keep_size",
		"failover", "REPLICATION", "--max-inflight-bytes", ":" + port,
	} {
		if !strings.Contains(r, want) {
			t.Errorf("README.md does not mention %q", want)
		}
	}
	for _, a := range requiredAlerts {
		if !strings.Contains(r, a) {
			t.Errorf("README.md does not list alert %s", a)
		}
	}
	// Relative links resolve.
	for _, m := range regexp.MustCompile(`\]\(([^)#:]+)(?:#[^)]*)?\)`).FindAllStringSubmatch(r, -1) {
		if _, err := os.Stat(filepath.Join(deployDir, filepath.FromSlash(m[1]))); errors.Is(err, fs.ErrNotExist) {
			t.Errorf("README.md links to %s, which does not exist", m[1])
		}
	}
}

// The manifests' security posture: a NetworkPolicy bounds who reaches the
// unauthenticated endpoints and where the pod may connect; the image is
// pinned by digest, never a moving tag.
func TestKubernetesHardening(t *testing.T) {
	np := readYAML(t, "kubernetes/networkpolicy.yaml")
	if str(get(np, "kind")) != "NetworkPolicy" || len(list(get(np, "spec", "policyTypes"))) != 2 {
		t.Fatalf("networkpolicy.yaml: %v", np)
	}
	k := readYAML(t, "kubernetes/kustomization.yaml")
	for _, img := range list(k["images"]) {
		if tag := str(get(img, "newTag")); tag == "latest" || tag != "" {
			t.Errorf("kustomization image %v uses a tag; pin a digest", img)
		}
		if !strings.HasPrefix(str(get(img, "digest")), "sha256:") {
			t.Errorf("kustomization image %v has no digest", img)
		}
	}
	sec, err := os.ReadFile(filepath.Join(deployDir, "kubernetes", "secret.example.yaml"))
	if err != nil || !strings.Contains(string(sec), "sslmode=verify-full") {
		t.Errorf("secret.example.yaml does not use sslmode=verify-full (%v)", err)
	}
}
