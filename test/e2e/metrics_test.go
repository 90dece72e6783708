package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/test/harness"
)

// poll retries cond every 50ms until it holds or within passes.
func poll(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *relay) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + r.http + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The series users alert on move as they should while Kafka goes down and
// comes back, and /readyz follows.
func TestMetricsAndReadiness(t *testing.T) {
	k := harness.KafkaForTest(t)
	if k.External() {
		t.Skip("stops the broker: needs the embedded one")
	}
	f := newFixture(t, withKafka(k))
	r := f.startRelay("--poll-interval", "100ms", "--heartbeat-interval", "100ms")
	poll(t, 10*time.Second, "/readyz 200", func() bool { c, _ := r.get(t, "/readyz"); return c == 200 })
	if c, _ := r.get(t, "/healthz"); c != 200 {
		t.Fatalf("/healthz %d", c)
	}

	var evs []event
	for i := 1; i <= 20; i++ {
		evs = append(evs, event{i, "k", "E", `{}`})
	}
	end := f.commit(evs...)
	f.waitConfirmed(end, 20*time.Second)
	poll(t, 10*time.Second, "published total 20", func() bool {
		return r.metric(t, `outboxd_events_published_total{topic="`+f.topic()+`"}`) == 20
	})
	for _, s := range []string{"outboxd_replication_connected"} {
		if v := r.metric(t, s); v != 1 {
			t.Fatalf("%s = %v", s, v)
		}
	}
	poll(t, 10*time.Second, "heartbeat delay measured", func() bool { return r.metric(t, "outboxd_replication_delay_seconds") > 0 })
	if v := r.metric(t, "outboxd_confirmed_flush_lsn"); uint64(v) < end {
		t.Fatalf("outboxd_confirmed_flush_lsn %v < %d", v, end)
	}
	if v := r.metric(t, "outboxd_publish_latency_seconds_count"); v != 20 {
		t.Fatalf("publish latency count %v, want 20", v)
	}

	// Kafka down: not ready, lag and in-flight rise, the oldest unacked ages.
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "/readyz 503 naming kafka", func() bool {
		c, body := r.get(t, "/readyz")
		return c == 503 && strings.Contains(body, "broker unreachable")
	})
	// The alert rules see the outage: the series they read, scraped now,
	// make OutboxdBrokerUnreachable fire (and OutboxdProduceErrors, which
	// the producer's own retries keep at 0 through an outage, does not).
	poll(t, 10*time.Second, "outboxd_broker_reachable 0", func() bool { return r.metric(t, "outboxd_broker_reachable") == 0 })
	outage := map[string]float64{}
	for _, s := range []string{"outboxd_broker_reachable", "outboxd_kafka_produce_errors_total"} {
		outage[s] = r.metric(t, s)
	}
	f.exec(`CREATE TABLE filler (x text)`)
	for i := 21; i <= 30; i++ {
		f.commit(event{i, "k", "E", `{"pad": "` + strings.Repeat("x", 1000) + `"}`})
	}
	f.exec(`INSERT INTO filler SELECT repeat('y', 1000) FROM generate_series(1, 2000)`)
	poll(t, 10*time.Second, "slot lag above 1 MB", func() bool { return r.metric(t, "outboxd_slot_lag_bytes") > 1<<20 })
	poll(t, 10*time.Second, "inflight events 10", func() bool { return r.metric(t, "outboxd_inflight_events") == 10 })
	poll(t, 10*time.Second, "oldest unacked ages", func() bool { return r.metric(t, "outboxd_oldest_unacked_age_seconds") > 0.2 })
	var status map[string]any
	_, body := r.get(t, "/status")
	if err := json.Unmarshal([]byte(body), &status); err != nil {
		t.Fatalf("/status: %v\n%s", err, body)
	}
	if status["slot"] != f.slot || status["inflight_events"] != float64(10) || status["kafka_reachable"] != false {
		t.Fatalf("/status = %s", body)
	}

	// Kafka back: everything delivered, lag falls, ready again.
	if err := k.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	end = f.walLSN()
	f.waitConfirmed(end, 120*time.Second)
	poll(t, 20*time.Second, "/readyz 200 again", func() bool { c, _ := r.get(t, "/readyz"); return c == 200 })
	poll(t, 10*time.Second, "lag back under 64 kB", func() bool { return r.metric(t, "outboxd_slot_lag_bytes") < 64<<10 })
	if v := r.metric(t, "outboxd_inflight_events"); v != 0 {
		t.Fatalf("inflight %v after recovery", v)
	}
	if v := r.metric(t, `outboxd_reconnects_total{target="kafka"}`); v < 1 {
		t.Fatalf("kafka reconnects %v", v)
	}
	if v := r.metric(t, `outboxd_events_published_total{topic="`+f.topic()+`"}`); v != 30 {
		t.Fatalf("published %v, want 30", v)
	}
	if v := r.metric(t, `outboxd_slot_wal_status{status="reserved"}`); v != 1 {
		t.Fatalf("wal_status reserved = %v", v)
	}
	for _, w := range []string{"broker unreachable", "broker reachable again"} {
		if !strings.Contains(r.Log(), w) {
			t.Errorf("log lacks %q", w)
		}
	}
	if v := r.metric(t, "outboxd_broker_reachable"); v != 1 {
		t.Errorf("outboxd_broker_reachable %v after recovery", v)
	}
	checkAlertsDuringOutage(t, outage)
}

// checkAlertsDuringOutage evaluates deploy/prometheus/alerts.yaml with
// promtool over the series outboxd exported while its broker was down, held
// for 10 minutes: OutboxdBrokerUnreachable fires, OutboxdProduceErrors does
// not (so it alone would never page for an outage).
func checkAlertsDuringOutage(t *testing.T, outage map[string]float64) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Logf("alert rules not evaluated: promtool not installed (bash .ci/run installs it)")
		return
	}
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(root, "deploy", "prometheus", "alerts.yaml")
	summary, description := alertAnnotations(t, rules, "OutboxdBrokerUnreachable")
	const instance = "outboxd:9187"
	var b strings.Builder
	fmt.Fprintf(&b, "rule_files:\n  - %s\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n", rules)
	for name, v := range outage {
		fmt.Fprintf(&b, "      - series: '%s{instance=\"%s\",job=\"outboxd\"}'\n        values: '%gx10'\n", name, instance, v)
	}
	fmt.Fprintf(&b, `    alert_rule_test:
      - eval_time: 5m
        alertname: OutboxdBrokerUnreachable
        exp_alerts:
          - exp_labels: {severity: critical, instance: "%s", job: outboxd}
            exp_annotations: {summary: %q, description: %q}
      - eval_time: 5m
        alertname: OutboxdProduceErrors
        exp_alerts: []
`, instance, strings.ReplaceAll(summary, "{{ $labels.instance }}", instance), description)
	test := filepath.Join(t.TempDir(), "outage_test.yaml")
	if err := os.WriteFile(test, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", test).CombinedOutput(); err != nil {
		t.Errorf("the alert rules over the series of a broker outage (%v): %v\n%s\n%s", outage, err, out, b.String())
	}
}

// alertAnnotations reads an alert's summary and description from a rules file.
func alertAnnotations(t *testing.T, rulesFile, alert string) (summary, description string) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				return r.Annotations["summary"], r.Annotations["description"]
			}
		}
	}
	t.Fatalf("%s has no alert %s", rulesFile, alert)
	return "", ""
}
