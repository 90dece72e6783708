package docker_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// maxImageBytes is the size budget of the outboxd image.
// The binary carries three broker clients and the OTLP/HTTP exporter, whose
// configuration package links grpc (28.5 MB image on 2026-12-02; 21.6 MB before
// NATS, RabbitMQ and tracing; 33.6 MB on 2026-12-02 with the schema
// registry's Avro, JSON Schema and Protobuf codecs).
const maxImageBytes = 36_000_000

// built is the outboxd image this process built from deploy/Dockerfile,
// shared by the tests and removed by TestMain.
var built struct {
	once sync.Once
	tag  string
	err  error
}

// outboxdImage builds deploy/Dockerfile once per test process: on the
// default bases (golang, distroless) where they can be pulled, else on the
// local ones (harness.GoBuilderImage, harness.RuntimeImage), with this
// machine's GOPROXY passed as a build arg.
func outboxdImage(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		builder, err := harness.OfficialOrLocal(ctx, "golang:1.26", harness.GoBuilderImage)
		if err != nil {
			built.err = err
			return
		}
		runtime, err := harness.OfficialOrLocal(ctx, "gcr.io/distroless/static-debian12:nonroot", harness.RuntimeImage)
		if err != nil {
			built.err = err
			return
		}
		root, err := harness.ModuleRoot()
		if err != nil {
			built.err = err
			return
		}
		proxy, _ := exec.CommandContext(ctx, "go", "env", "GOPROXY").Output()
		tag := fmt.Sprintf("outboxd-test/outboxd:test-%d", os.Getpid())
		start := time.Now()
		_, err = harness.DockerCLI(ctx, "build", "--progress=plain", "--network", "host",
			"-f", filepath.Join(root, "deploy", "Dockerfile"),
			"--build-arg", "BUILDER_IMAGE="+builder,
			"--build-arg", "RUNTIME_IMAGE="+runtime,
			"--build-arg", "GOPROXY="+strings.TrimSpace(string(proxy)),
			"--build-arg", "VERSION=image-test",
			"-t", tag, root)
		if err != nil {
			built.err = err
			return
		}
		built.tag = tag
		fmt.Fprintf(os.Stderr, "test/docker: built %s from deploy/Dockerfile (BUILDER_IMAGE=%s RUNTIME_IMAGE=%s) in %s\n",
			tag, builder, runtime, time.Since(start).Round(100*time.Millisecond))
	})
	if built.err != nil {
		t.Fatalf("building deploy/Dockerfile: %v", built.err)
	}
	return built.tag
}

func removeBuiltImage() {
	if built.tag != "" {
		_, _ = harness.DockerCLI(context.Background(), "rmi", "-f", built.tag)
	}
}

// TestImage runs the image as a user would: `outboxd setup` then
// `outboxd run` against PostgreSQL and Kafka, as the nonroot user, and
// checks that events arrive in commit order, /readyz turns 200, /metrics
// counts them, SIGTERM exits 0, and the image fits its size budget.
func TestImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img := outboxdImage(t)

	info, err := harness.DockerCLI(ctx, "image", "inspect", "--format", "{{.Size}} {{.Config.User}} {{json .Config.Entrypoint}} {{json .Config.Cmd}}", img)
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(info)
	size, _ := strconv.ParseInt(fields[0], 10, 64)
	t.Logf("image %s: %.1f MB (%d bytes), user %s, entrypoint %s %s", img, float64(size)/1e6, size, fields[1], fields[2], fields[3])
	if size <= 0 || size > maxImageBytes {
		t.Errorf("image size %d bytes, want ≤ %d", size, maxImageBytes)
	}
	if fields[1] != "65532:65532" || fields[2] != `["/outboxd"]` || fields[3] != `["run"]` {
		t.Errorf("image config: user %s entrypoint %s cmd %s, want 65532:65532 [\"/outboxd\"] [\"run\"]", fields[1], fields[2], fields[3])
	}

	pg := harness.PostgresForTest(t)
	kafka := harness.KafkaForTest(t)
	if err := pg.Exec(ctx, "postgres", `CREATE DATABASE imagetest`); err != nil {
		t.Fatal(err)
	}
	admin := pg.DSN("imagetest")
	if out, err := harness.DockerCLI(ctx, "run", "--rm", "--network", "host", img, "setup", "--postgres", admin, "--role", "outboxd_image"); err != nil {
		t.Fatalf("outboxd setup in the image: %v", err)
	} else {
		t.Logf("outboxd setup:\n%s", out)
	}
	// The least-privilege role setup made; the harness server trusts 127.0.0.1.
	relayDSN := strings.Replace(admin, "postgres://postgres@", "postgres://outboxd_image@", 1)
	if relayDSN == admin && !pg.External() {
		t.Fatalf("cannot derive the role's DSN from %s", admin)
	}
	httpPort, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("outboxd-image-test-%d", os.Getpid())
	start := time.Now()
	id, err := harness.DockerCLI(ctx, "run", "-d", "--name", name, "--network", "host", img, "run",
		"--postgres", relayDSN,
		"--kafka-brokers", strings.Join(kafka.Brokers(), ","),
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort),
		"--log-format", "json")
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(id)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := harness.DockerCLI(context.Background(), "logs", id)
			t.Logf("outboxd container log:\n%s", logs)
		}
		_, _ = harness.DockerCLI(context.Background(), "rm", "-f", id)
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitFor(t, ctx, time.Minute, "/readyz 200", func() bool { code, _ := get(base + "/readyz"); return code == 200 })
	t.Logf("/readyz 200 %s after docker run", time.Since(start).Round(10*time.Millisecond))

	// The process runs as uid/gid 65532 (real, effective, saved, fs).
	pid, err := harness.DockerCLI(ctx, "inspect", "--format", "{{.State.Pid}}", id)
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/" + strings.TrimSpace(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "Uid" || k == "Gid") {
			if f := strings.Fields(v); len(f) != 4 || strings.Count(v, "65532") != 4 {
				t.Errorf("%s: %s, want 65532 four times", k, strings.TrimSpace(v))
			}
		}
	}

	// 3 transactions: 5 events, 1 event, 4 events, on keys k0..k2.
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	want := map[string][]string{}
	n := 0
	for _, size := range []int{5, 1, 4} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range size {
			n++
			id, key := fmt.Sprintf("00000000-0000-0000-0000-%012d", n), fmt.Sprintf("k%d", n%3)
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'Created', $3)`,
				id, key, fmt.Sprintf(`{"n": %d}`, n)); err != nil {
				t.Fatal(err)
			}
			want[key] = append(want[key], id+` {"n": `+strconv.Itoa(n)+`}`)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	readCtx, cancelRead := context.WithTimeout(ctx, time.Minute)
	recs, err := harness.ReadAll(readCtx, kafka.Brokers(), []string{"outbox.event.order"}, n)
	cancelRead()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("%d records in outbox.event.order, want %d", len(recs), n)
	}
	got := map[string][]string{}
	for _, r := range recs {
		var hid string
		for _, h := range r.Headers {
			if h.Key == "id" {
				hid = string(h.Value)
			}
		}
		got[string(r.Key)] = append(got[string(r.Key)], hid+" "+string(r.Value))
	}
	for key, ids := range want {
		if strings.Join(got[key], "|") != strings.Join(ids, "|") {
			t.Errorf("key %s: got %q, want %q", key, got[key], ids)
		}
	}
	waitFor(t, ctx, 30*time.Second, "outboxd_events_published_total{topic=outbox.event.order} 10", func() bool {
		_, body := get(base + "/metrics")
		return metricValue(body, `outboxd_events_published_total{topic="outbox.event.order"}`) == "10"
	})

	// SIGTERM (docker stop) drains and exits 0.
	if _, err := harness.DockerCLI(ctx, "stop", "--time", "60", id); err != nil {
		t.Fatal(err)
	}
	code, err := harness.DockerCLI(ctx, "inspect", "--format", "{{.State.ExitCode}}", id)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(code) != "0" {
		t.Errorf("outboxd exited %s after docker stop, want 0", strings.TrimSpace(code))
	}
}

// metricValue returns the value of the sample (name with its labels, as
// exposed) in a Prometheus text exposition ("" if absent).
func metricValue(body, name string) string {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func get(url string) (int, string) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
