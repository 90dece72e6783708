package docker_test

import (
	"context"
	"fmt"
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
//   - postgres: the local image with the official entrypoint's behaviour,
//     so the real init.sql mount and the TCP pg_isready health check run;
//   - kafka: kfaked (no shell, so no health check; outboxd waits for Kafka);
//   - outboxd: built by compose from deploy/Dockerfile on the local bases.
//
// Prometheus and Grafana are not started (no image here); `docker compose
// config` validates them with the rest of the file.
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
`

// compose runs docker compose on deploy/compose.yaml plus the override.
type compose struct {
	t        *testing.T
	project  string
	files    []string
	root     string
	override string
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
	proxy, _ := exec.CommandContext(ctx, "go", "env", "GOPROXY").Output()
	ports := map[string]int{}
	for _, name := range []string{"pgPort", "kafkaPort", "httpPort"} {
		if ports[name], err = harness.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	project := fmt.Sprintf("outboxd-compose-test-%d", os.Getpid())
	outboxdImage := "outboxd-test/outboxd:" + project
	override := strings.NewReplacer(
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
	if _, err := c.run(ctx, "up", "--detach", "postgres", "kafka", "outboxd"); err != nil {
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
