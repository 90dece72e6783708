package docker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// composeOverride swaps the registry images of deploy/compose.yaml for
// local stand-ins and moves every service to the host network on free
// loopback ports (no compose network, so no private-range addresses):
//
//   - postgres: the local image with the official entrypoint's behaviour,
//     so the real init.sql mount and the TCP pg_isready health check run;
//
//   - kafka: kfaked (no shell, so no health check; outboxd waits for Kafka);
//
//   - outboxd: built by compose from deploy/Dockerfile on the local bases.
//
//   - prometheus: Debian's prometheus binary on the local bookworm image
//     (see prometheusImage), with the real alerts.yaml and prometheus.yml,
//     the latter with only its target moved to outboxd's loopback port; its
//     health check uses bash instead of wget (not in the image).
//
// Grafana is not started (no image here); `docker compose config`
// validates it with the rest of the file.
const composeOverride = `services:
  postgres:
    image: {{pgImage}}
    pull_policy: never
    network_mode: host
    ports: !reset []
    command: postgres -c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10 -c max_slot_wal_keep_size=10GB -c listen_addresses=127.0.0.1 -c port={{pgPort}}
    healthcheck:
      test: ["CMD", "pg_isready", "-h", "127.0.0.1", "-p", "{{pgPort}}", "-U", "postgres", "-d", "app"]
      interval: 1s
      start_period: 0s
  kafka:
    image: {{kafkaImage}}
    pull_policy: never
    network_mode: host
    hostname: !reset ""
    ports: !reset []
    environment: !reset {}
    command: ["-port", "{{kafkaPort}}", "-data-dir", "/data", "-partitions", "3"]
    healthcheck:
      disable: true
  outboxd:
    image: {{outboxdImage}}
    pull_policy: never
    network_mode: host
    ports: !reset []
    build:
      network: host
      args:
        BUILDER_IMAGE: {{builder}}
        RUNTIME_IMAGE: {{runtime}}
        GOPROXY: "{{goproxy}}"
    environment:
      OUTBOXD_POSTGRES: postgres://outboxd:outboxd@127.0.0.1:{{pgPort}}/app?sslmode=disable
      OUTBOXD_KAFKA_BROKERS: 127.0.0.1:{{kafkaPort}}
      OUTBOXD_HTTP_ADDR: 127.0.0.1:{{httpPort}}
    depends_on: !override
      postgres:
        condition: service_healthy
      kafka:
        condition: service_started
  prometheus:
    image: {{promImage}}
    pull_policy: never
    network_mode: host
    ports: !reset []
    command: ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", "--web.listen-address=127.0.0.1:{{promPort}}"]
    volumes:
      - {{promConfig}}:/etc/prometheus/prometheus.yml:ro
    healthcheck:
      test: ["CMD", "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/{{promPort}} && printf 'GET /-/ready HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q ' 200 ' <&3"]
      interval: 1s
`

// prometheusImage is a stand-in for prom/prometheus: the machine's
// prometheus binary (Debian's package, which .ci/run installs for promtool)
// on the local bookworm image, with prom/prometheus's entrypoint, user
// (nobody) and data directory.
func prometheusImage(ctx context.Context) (string, error) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		return "", fmt.Errorf("prometheus binary not found: apt-get install prometheus (.ci/run does): %w", err)
	}
	body, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	base, err := harness.LocalPostgresImage(ctx)
	if err != nil {
		return "", err
	}
	dockerfile := "FROM " + base + `
COPY prometheus /bin/prometheus
RUN mkdir -p /prometheus && chown 65534:65534 /prometheus
USER 65534:65534
WORKDIR /prometheus
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
`
	sum := sha256.Sum256(append([]byte(dockerfile), body...))
	tag := "outboxd-test/prometheus:" + hex.EncodeToString(sum[:6])
	if _, err := harness.DockerCLI(ctx, "image", "inspect", tag); err == nil {
		return tag, nil
	}
	dir, err := os.MkdirTemp("", "outboxd-prometheus-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	for name, b := range map[string][]byte{"prometheus": body, "Dockerfile": []byte(dockerfile)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			return "", err
		}
	}
	if _, err := harness.DockerCLI(ctx, "build", "--network", "host", "-q", "-t", tag, dir); err != nil {
		return "", err
	}
	return tag, nil
}

// compose runs docker compose on deploy/compose.yaml plus the override.
type compose struct {
	t       *testing.T
	project string
	files   []string
	root    string
}

func (c *compose) run(ctx context.Context, args ...string) (string, error) {
	all := []string{"compose", "-p", c.project}
	for _, f := range c.files {
		all = append(all, "-f", f)
	}
	cmd := exec.CommandContext(ctx, "docker", append(all, args...)...)
	cmd.Dir = c.root
	// Compose's bake builder refuses build.network host without a
	// --allow=network.host entitlement; the classic compose builder takes it.
	cmd.Env = append(os.Environ(), "COMPOSE_BAKE=false")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w\n%s", strings.Join(append(all, args...), " "), err, out)
	}
	return string(out), nil
}

// TestComposeConfig validates the whole of deploy/compose.yaml (Prometheus
// and Grafana included) with docker compose itself.
func TestComposeConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := &compose{t: t, project: "outboxd-config-test", root: root, files: []string{filepath.Join(root, "deploy", "compose.yaml")}}
	out, err := c.run(ctx, "config", "--services")
	if err != nil {
		t.Fatal(err)
	}
	services := strings.Fields(out)
	sort.Strings(services)
	if got, want := strings.Join(services, " "), "grafana kafka outboxd postgres prometheus"; got != want {
		t.Errorf("services %q, want %q", got, want)
	}
}

// TestComposeUp brings deploy/compose.yaml up (postgres, kafka, outboxd;
// see composeOverride), writes outbox rows, reads them from Kafka, checks
// /readyz and /metrics, stops outboxd (exit 0), and brings it all down
// with its volumes.
func TestComposeUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	pgImage, err := harness.OfficialOrLocal(ctx, "postgres:16", harness.LocalPostgresImage)
	if err != nil {
		t.Fatal(err)
	}
	kafkaImage, err := harness.KfakedImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	builder, err := harness.OfficialOrLocal(ctx, "golang:1.26", harness.GoBuilderImage)
	if err != nil {
		t.Fatal(err)
	}
	runtime, err := harness.OfficialOrLocal(ctx, "gcr.io/distroless/static-debian12:nonroot", harness.RuntimeImage)
	if err != nil {
		t.Fatal(err)
	}
	promImage, err := prometheusImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	proxy, _ := exec.CommandContext(ctx, "go", "env", "GOPROXY").Output()
	ports := map[string]int{}
	for _, name := range []string{"pgPort", "kafkaPort", "httpPort", "promPort"} {
		if ports[name], err = harness.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	project := fmt.Sprintf("outboxd-compose-test-%d", os.Getpid())
	outboxdImage := "outboxd-test/outboxd:" + project
	promConfig := filepath.Join(t.TempDir(), "prometheus.yml")
	realConfig, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(realConfig), `"outboxd:9187"`) {
		t.Fatal(`deploy/prometheus/prometheus.yml has no target "outboxd:9187" to move`)
	}
	if err := os.WriteFile(promConfig, []byte(strings.ReplaceAll(string(realConfig), `"outboxd:9187"`, fmt.Sprintf(`"127.0.0.1:%d"`, ports["httpPort"]))), 0o644); err != nil {
		t.Fatal(err)
	}
	override := strings.NewReplacer(
		"{{promImage}}", promImage, "{{promConfig}}", promConfig, "{{promPort}}", fmt.Sprint(ports["promPort"]),
		"{{pgImage}}", pgImage, "{{kafkaImage}}", kafkaImage, "{{outboxdImage}}", outboxdImage,
		"{{builder}}", builder, "{{runtime}}", runtime, "{{goproxy}}", strings.TrimSpace(string(proxy)),
		"{{pgPort}}", fmt.Sprint(ports["pgPort"]), "{{kafkaPort}}", fmt.Sprint(ports["kafkaPort"]),
		"{{httpPort}}", fmt.Sprint(ports["httpPort"]),
	).Replace(composeOverride)
	overridePath := filepath.Join(t.TempDir(), "compose.override.yaml")
	if err := os.WriteFile(overridePath, []byte(override), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &compose{t: t, project: project, root: root, files: []string{filepath.Join(root, "deploy", "compose.yaml"), overridePath}}

	start := time.Now()
	if _, err := c.run(ctx, "build", "outboxd"); err != nil {
		t.Fatal(err)
	}
	t.Logf("docker compose build outboxd: %s", time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() { _, _ = harness.DockerCLI(context.Background(), "rmi", "-f", outboxdImage) })

	start = time.Now()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if t.Failed() {
			logs, _ := c.run(ctx, "logs", "--no-color")
			t.Logf("docker compose logs:\n%s", logs)
		}
		if _, err := c.run(ctx, "down", "--volumes", "--remove-orphans", "--timeout", "60"); err != nil {
			t.Error(err)
		}
		for _, kind := range []string{"container", "volume"} {
			args := []string{kind, "ls", "-q", "--filter", "label=com.docker.compose.project=" + project}
			if kind == "container" {
				args = []string{"ps", "-aq", "--filter", "label=com.docker.compose.project=" + project}
			}
			if out, err := harness.DockerCLI(ctx, args...); err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("after docker compose down, %ss of %s are left: %q %v", kind, project, out, err)
			}
		}
	})
	if _, err := c.run(ctx, "up", "--detach", "postgres", "kafka", "outboxd", "prometheus"); err != nil {
		t.Fatal(err)
	}
	t.Logf("docker compose up (postgres healthy, then outboxd): %s", time.Since(start).Round(100*time.Millisecond))
	base := fmt.Sprintf("http://127.0.0.1:%d", ports["httpPort"])
	waitFor(t, ctx, 2*time.Minute, "/readyz 200", func() bool { code, _ := get(base + "/readyz"); return code == 200 })
	t.Logf("/readyz 200 %s after docker compose up", time.Since(start).Round(100*time.Millisecond))

	// As the application would: the superuser of the demo, in database app.
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/app?sslmode=disable", ports["pgPort"]))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	const n = 12
	var want []string
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if i == 7 { // two transactions
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if tx, err = conn.Begin(ctx); err != nil {
				t.Fatal(err)
			}
		}
		payload := fmt.Sprintf(`{"n": %d}`, i)
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('invoice', 'inv-1', 'Issued', $1)`, payload); err != nil {
			t.Fatal(err)
		}
		want = append(want, payload)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	readCtx, cancelRead := context.WithTimeout(ctx, time.Minute)
	recs, err := harness.ReadAll(readCtx, []string{fmt.Sprintf("127.0.0.1:%d", ports["kafkaPort"])}, []string{"outbox.event.invoice"}, n)
	cancelRead()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		if string(r.Key) != "inv-1" {
			t.Errorf("record key %q, want inv-1", r.Key)
		}
		got = append(got, string(r.Value))
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("outbox.event.invoice holds %q, want %q", got, want)
	}
	waitFor(t, ctx, 30*time.Second, "outboxd_events_published_total{topic=outbox.event.invoice} 12", func() bool {
		_, body := get(base + "/metrics")
		return metricValue(body, `outboxd_events_published_total{topic="outbox.event.invoice"}`) == fmt.Sprint(n)
	})

	checkPrometheus(t, ctx, c, fmt.Sprintf("http://127.0.0.1:%d", ports["promPort"]), n)

	// docker compose stop: SIGTERM, drained within stop_grace_period, exit 0.
	if _, err := c.run(ctx, "stop", "outboxd"); err != nil {
		t.Fatal(err)
	}
	out, err := c.run(ctx, "ps", "--all", "--format", "{{.Service}} {{.ExitCode}}", "outboxd")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "outboxd 0" {
		t.Errorf("after docker compose stop outboxd: %q, want exit code 0", out)
	}
}

// checkPrometheus: the compose health check passes, Prometheus scrapes
// outboxd (job outboxd up), has loaded every alert rule of alerts.yaml and
// evaluated each without error, and sees the published events.
func checkPrometheus(t *testing.T, ctx context.Context, c *compose, base string, events int) {
	t.Helper()
	start := time.Now()
	waitFor(t, ctx, time.Minute, "prometheus healthy", func() bool {
		out, err := c.run(ctx, "ps", "--format", "{{.Health}}", "prometheus")
		return err == nil && strings.TrimSpace(out) == "healthy"
	})
	query := func(q string) string {
		_, body := get(base + "/api/v1/query?query=" + url.QueryEscape(q))
		var r struct {
			Data struct {
				Result []struct {
					Value [2]any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.Unmarshal([]byte(body), &r) != nil || len(r.Data.Result) != 1 {
			return ""
		}
		v, _ := r.Data.Result[0].Value[1].(string)
		return v
	}
	// scrape_interval is 15s in prometheus.yml.
	waitFor(t, ctx, time.Minute, `up{job="outboxd"} == 1`, func() bool { return query(`up{job="outboxd"}`) == "1" })
	waitFor(t, ctx, time.Minute, "published events in Prometheus", func() bool {
		return query(`sum(outboxd_events_published_total{job="outboxd"})`) == fmt.Sprint(events)
	})
	alerts, err := os.ReadFile(filepath.Join(c.root, "deploy", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	wantRules := strings.Count(string(alerts), "- alert:")
	var last string
	waitFor(t, ctx, time.Minute, fmt.Sprintf("%d alert rules evaluated without error", wantRules), func() bool {
		_, body := get(base + "/api/v1/rules?type=alert")
		var r struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name, Health, LastError string
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if json.Unmarshal([]byte(body), &r) != nil {
			return false
		}
		ok, total := 0, 0
		for _, g := range r.Data.Groups {
			for _, rule := range g.Rules {
				total++
				if rule.Health == "ok" {
					ok++
				} else if rule.LastError != "" {
					last = rule.Name + ": " + rule.LastError
				}
			}
		}
		return total == wantRules && ok == total
	})
	if last != "" {
		t.Logf("a rule failed before it passed: %s", last)
	}
	t.Logf("prometheus healthy, scraping outboxd, %d alert rules ok: %s", wantRules, time.Since(start).Round(100*time.Millisecond))
}
