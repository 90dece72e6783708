package main

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/sink/kafka"
)

// openRun parses and validates run's options and opens the broker they
// name (Kafka's sink contacts nothing until it is used).
func openRun(t *testing.T, args ...string) *openedBroker {
	t.Helper()
	o, _, err := parseRun(t, append([]string{"--postgres", "postgres://u@db/app"}, args...), nil, "")
	if err == nil {
		err = o.validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := openBroker(t.Context(), &o, log, func(string, error) {}, &durabilityWarnings{log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// Kafka is opened like every other broker, from --broker kafka:// or from
// --kafka-brokers alone; at least once it keeps the progress record on
// --progress-topic under the key the engine reads, exactly once it hands
// the engine its transactional sink instead.
func TestKafkaOpensLikeEveryBroker(t *testing.T) {
	for _, args := range [][]string{
		{"--kafka-brokers", "k1:9092,k2:9092"},
		{"--broker", "kafka://k1:9092,k2:9092", "--progress-topic", "acme.progress"},
	} {
		b := openRun(t, args...)
		if _, ok := b.Sink.(*kafka.Sink); !ok || b.Transactional != nil || b.NewProgress == nil {
			t.Fatalf("%v: sink %T, transactional %v, progress %v", args, b.Sink, b.Transactional, b.NewProgress != nil)
		}
		topic := "outboxd.progress"
		if slices.Contains(args, "acme.progress") {
			topic = "acme.progress"
		}
		ps := b.NewProgress("7312345678901234567/outboxd")
		if got, want := fmt.Sprint(ps), "topic "+topic+", key 7312345678901234567/outboxd"; got != want {
			t.Errorf("%v: progress record %q, want %q", args, got, want)
		}
		if p, ok := ps.(kafka.ProgressStore); !ok || p.Legacy != "outboxd" {
			t.Errorf("%v: progress store %#v does not read the slot-only key of older versions", args, ps)
		}
	}
	b := openRun(t, "--broker", "kafka://k1:9092", "--exactly-once", "--transaction-timeout", "2m")
	if b.Transactional == nil || b.Transactional.Sink != b.Sink.(*kafka.Sink) || b.Transactional.SplitAge != 30*time.Second || b.Transactional.Checkpoints == nil || b.NewProgress != nil {
		t.Fatalf("exactly-once: %+v", b)
	}
}

// The Kafka SASL warning is Kafka's: it comes with the Kafka broker, and
// Kafka's options given to another broker warn about nothing.
func TestKafkaInsecureTransport(t *testing.T) {
	sasl := []string{"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "u", "--kafka-sasl-password", "p"}
	b := openRun(t, append([]string{"--kafka-brokers", "k:9092"}, sasl...)...)
	if len(b.Insecure) != 1 || !strings.HasPrefix(b.Insecure[0], "Kafka SASL SCRAM-SHA-512 without TLS") {
		t.Fatalf("insecure %q", b.Insecure)
	}
	if b := openRun(t, append([]string{"--kafka-brokers", "k:9092", "--kafka-tls"}, sasl...)...); len(b.Insecure) != 0 {
		t.Fatalf("with TLS: insecure %q", b.Insecure)
	}
	o, _, err := parseRun(t, append([]string{"--postgres", "postgres://u@127.0.0.1/app", "--broker", "nats://127.0.0.1:4222"}, sasl...), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if w := transportWarnings(o, noEnv); len(w) != 0 {
		t.Fatalf("NATS warned about Kafka: %q", w)
	}
}

// The broker's registration decides its spans' messaging.system and its
// CloudEvents binding, whatever the scheme's case.
func TestBrokerRegistration(t *testing.T) {
	for _, scheme := range brokerSchemes() {
		k := brokerKinds[scheme]
		if k.name == "" || k.system == "" || k.cloudEvents.Prefix == "" || k.options == nil {
			t.Errorf("%s:// registered without a name, messaging system, CloudEvents binding or options: %+v", scheme, k)
		}
	}
	for url, want := range map[string]string{"": "ce_", "kafka://k:9092": "ce_", "nats://h": "ce-", "TLS://h": "ce-", "amqp://h": "cloudEvents:", "AMQPS://h": "cloudEvents:"} {
		if got := cloudEventsConfig(runOptions{Broker: url}).Binding.Prefix; got != want {
			t.Errorf("%q: CloudEvents prefix %q, want %q", url, got, want)
		}
	}
}

// The engine gets the broker's guarantee: a transactional broker's sink
// and checkpoints with --exactly-once, else the progress store's
// constructor; never both.
func TestEngineConfigDelivery(t *testing.T) {
	for _, exactlyOnce := range []bool{false, true} {
		args := []string{"--kafka-brokers", "k:9092"}
		if exactlyOnce {
			args = append(args, "--exactly-once")
		}
		b := openRun(t, args...)
		o, _, err := parseRun(t, append([]string{"--postgres", "postgres://u@db/app"}, args...), nil, "")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := engineConfig(o, nil, slog.New(slog.DiscardHandler), []string{"w"}, b)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Sink != b.Sink || len(cfg.Warnings) != 1 {
			t.Fatalf("exactly-once %v: sink %v, warnings %q", exactlyOnce, cfg.Sink, cfg.Warnings)
		}
		if got := cfg.Delivery == outboxd.ExactlyOnce && cfg.TxnSink != nil && cfg.Checkpoints != nil && cfg.SplitAge == 15*time.Second; got != exactlyOnce {
			t.Errorf("exactly-once %v: delivery %v, txn sink %v, split age %v", exactlyOnce, cfg.Delivery, cfg.TxnSink, cfg.SplitAge)
		}
		if (cfg.NewProgressStore != nil) == exactlyOnce || cfg.ProgressStore != nil {
			t.Errorf("exactly-once %v: progress store constructor %v", exactlyOnce, cfg.NewProgressStore != nil)
		}
	}
}

// A user's OUTBOXD_* variables keep their meaning: OUTBOXD_KAFKA_BROKERS
// alone is Kafka, OUTBOXD_BROKER=kafka://… is too, and both together are
// refused.
func TestKafkaFromEnvironment(t *testing.T) {
	pg := map[string]string{"OUTBOXD_POSTGRES": "postgres://u@db/app"}
	for _, tc := range []struct {
		env  map[string]string
		want string // "" valid
	}{
		{map[string]string{"OUTBOXD_KAFKA_BROKERS": "k1:9092,k2:9092", "OUTBOXD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "OUTBOXD_COMPRESSION": "zstd"}, ""},
		{map[string]string{"OUTBOXD_BROKER": "kafka://k1:9092", "OUTBOXD_CHECKPOINT_TOPIC": "acme.cp", "OUTBOXD_EXACTLY_ONCE": "true"}, ""},
		{map[string]string{"OUTBOXD_BROKER": "kafka://k1:9092", "OUTBOXD_KAFKA_BROKERS": "k:9092"}, "--broker and --kafka-brokers exclude each other"},
	} {
		for k, v := range pg {
			tc.env[k] = v
		}
		o, _, err := parseRun(t, nil, tc.env, "")
		if err != nil {
			t.Fatal(err)
		}
		err = o.validate()
		if tc.want == "" {
			k := kafkaOf(o)
			if err != nil || messagingSystem(o.Broker) != "kafka" || (tc.env["OUTBOXD_COMPRESSION"] != "" && k.Compression != "zstd") ||
				(tc.env["OUTBOXD_CHECKPOINT_TOPIC"] != "" && k.CheckpointTopic != "acme.cp") {
				t.Errorf("%v: %v, options %+v", tc.env, err, k)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
}
