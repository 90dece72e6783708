package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/internal/humanize"
	"github.com/outboxd/outboxd/router"
)

func parseRun(t *testing.T, args []string, env map[string]string, file string) (runOptions, *optionSet, error) {
	t.Helper()
	if file != "" {
		p := filepath.Join(t.TempDir(), "outboxd.yaml")
		if err := os.WriteFile(p, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", p}, args...)
	}
	var o runOptions
	set := newOptionSet("run", "router", "tables")
	o.register(set)
	err := set.parse(args, func(k string) string { return env[k] })
	return o, set, err
}

// kafkaOf is o's Kafka options (broker_kafka.go).
func kafkaOf(o runOptions) *kafkaOptions { return o.BrokerOpts["kafka"].(*kafkaOptions) }

// Command line over environment over file over defaults, one name for all three.
func TestOptionPrecedence(t *testing.T) {
	file := `
postgres: postgres://file@db/app
slot: from_file
kafka:
  brokers: [k1:9092, k2:9092]
  sasl:
    mechanism: SCRAM-SHA-512
shutdown-timeout: 5s
router:
  route.by.field: event_type
`
	o, set, err := parseRun(t, []string{"--slot", "from_flag"},
		map[string]string{"OUTBOXD_SLOT": "from_env", "OUTBOXD_POSTGRES": "postgres://env@db/app"}, file)
	if err != nil {
		t.Fatal(err)
	}
	if o.Slot != "from_flag" || o.Postgres != "postgres://env@db/app" || kafkaOf(o).Brokers.String() != "k1:9092,k2:9092" ||
		kafkaOf(o).Auth.SASLMechanism != "SCRAM-SHA-512" || o.ShutdownTimeout != 5*time.Second || o.Publication != "outboxd" {
		t.Fatalf("options: %+v", o)
	}
	if _, ok := set.sections["router"]; !ok {
		t.Fatal("router section not kept for the router")
	}
}

func TestOptionErrorsNameTheOption(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		file string
		want string
	}{
		"unknown file key": {file: "kafka:\n  brokerz: [x]\n", want: "unknown key(s) kafka.brokerz"},
		"bad env value":    {env: map[string]string{"OUTBOXD_SHUTDOWN_TIMEOUT": "soon"}, want: "OUTBOXD_SHUTDOWN_TIMEOUT (--shutdown-timeout)"},
		"bad file choice":  {file: "on-invalid: drop\n", want: "config file key on-invalid (--on-invalid)"},
		"bad flag":         {args: []string{"--max-slot-lag", "lots"}, want: "max-slot-lag"},
		"stray argument":   {args: []string{"extra"}, want: `unexpected argument "extra"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := parseRun(t, tc.args, tc.env, tc.file)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestRunValidation(t *testing.T) {
	o, _, err := parseRun(t, []string{"--slot", "Bad-Name", "--max-inflight-events", "0"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	err = o.validate()
	for _, want := range []string{"--postgres", "--kafka-brokers", "--slot", "--max-inflight-events"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate: %v, want it to name %s", err, want)
		}
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "64MiB": 64 << 20, "1GiB": 1 << 30, "512KB": 512000, "2 GiB": 2 << 30} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("%q → %d, %v; want %d", in, b, err, want)
		}
	}
	if humanize.Bytes(1536<<20) != "1.5GiB" || humanize.Bytes(544) != "544B" {
		t.Errorf("humanBytes: %s %s", humanize.Bytes(1536<<20), humanize.Bytes(544))
	}
}

// --topic-config repeats on the command line, is a list in the file and
// comma-separated in the environment; the other topic options default to
// the broker's (-1) and creation is on.
func TestTopicOptions(t *testing.T) {
	o, _, err := parseRun(t, []string{"--topic-config", "retention.ms=1000", "--topic-config", "min.insync.replicas=2"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := kafkaOf(o).Topics.Configs.String(); got != "min.insync.replicas=2,retention.ms=1000" {
		t.Fatalf("flags: %s", got)
	}
	if !kafkaOf(o).Topics.Create || kafkaOf(o).Topics.Partitions != -1 || kafkaOf(o).Topics.ReplicationFactor != -1 {
		t.Fatalf("defaults: %+v", kafkaOf(o).Topics)
	}
	o, _, err = parseRun(t, nil, nil, "topic-config: [cleanup.policy=compact, retention.ms=5]\ntopic-partitions: 6\ncreate-topics: false\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := kafkaOf(o).Topics.Configs.String(); got != "cleanup.policy=compact,retention.ms=5" || kafkaOf(o).Topics.Partitions != 6 || kafkaOf(o).Topics.Create {
		t.Fatalf("file: %s %+v", got, kafkaOf(o).Topics)
	}
	o, _, err = parseRun(t, nil, map[string]string{"OUTBOXD_TOPIC_CONFIG": "a=1,b=2", "OUTBOXD_TOPIC_REPLICATION_FACTOR": "3"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := kafkaOf(o).Topics.Configs.String(); got != "a=1,b=2" || kafkaOf(o).Topics.ReplicationFactor != 3 {
		t.Fatalf("env: %s %+v", got, kafkaOf(o).Topics)
	}
	if _, _, err := parseRun(t, []string{"--topic-config", "novalue"}, nil, ""); err == nil || !strings.Contains(err.Error(), "key=value") {
		t.Fatalf("bad pair: %v", err)
	}
	kafkaOf(o).Topics.Partitions = 0
	if err := kafkaOf(o).Topics.validate(); err == nil {
		t.Fatal("--topic-partitions 0 accepted")
	}
}

// key.format under tables: is per table, over --key-format; a bad value is
// rejected naming the table and the option.
func TestKeyFormatPerTableInFile(t *testing.T) {
	file := `
tables:
  public.legacy_outbox:
    key.format: json-string
`
	o, set, err := parseRun(t, []string{"--key-format", "raw"}, nil, file)
	if err != nil {
		t.Fatal(err)
	}
	defaults, tables, err := router.ConfigFromYAML(set.sections["router"], set.sections["tables"])
	if err != nil {
		t.Fatal(err)
	}
	if tables["public.legacy_outbox"]["key.format"] != "json-string" {
		t.Fatalf("tables: %v", tables)
	}
	if _, err := router.New(routerConfig(o, defaults, tables)); err != nil {
		t.Fatal(err)
	}
	tables["public.legacy_outbox"]["key.format"] = "quoted"
	_, err = router.New(routerConfig(o, defaults, tables))
	if err == nil || !strings.Contains(err.Error(), `table public.legacy_outbox: key.format: "quoted" is not one of raw, json-string`) {
		t.Fatalf("err = %v", err)
	}
}

// The flags' words reach the engine as its constants, and the defaults
// are the engine's zero values.
func TestEngineChoices(t *testing.T) {
	var cfg outboxd.Config
	if err := engineChoices(runOptions{OnInvalid: "dead-letter", SlotFailover: "false", PgoutputBinary: "auto"}, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.OnInvalid != outboxd.OnInvalidDeadLetter || cfg.SlotFailover != outboxd.SlotFailoverFalse || cfg.PgoutputBinary != outboxd.PgoutputBinaryAuto {
		t.Fatalf("%v %v %v", cfg.OnInvalid, cfg.SlotFailover, cfg.PgoutputBinary)
	}
	if err := engineChoices(runOptions{OnInvalid: "fail", SlotFailover: "auto", PgoutputBinary: "off"}, &cfg); err != nil || cfg.OnInvalid != 0 || cfg.SlotFailover != 0 || cfg.PgoutputBinary != 0 {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	if err := engineChoices(runOptions{OnInvalid: "drop", SlotFailover: "auto", PgoutputBinary: "off"}, &cfg); err == nil {
		t.Fatal(`"drop" accepted`)
	}
}
