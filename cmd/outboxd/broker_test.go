package main

import (
	"strings"
	"testing"
)

// --broker picks the broker by its scheme; Kafka stays the default; what a
// broker cannot honour is refused before anything starts.
func TestBrokerFlag(t *testing.T) {
	runValidateCases{
		"kafka default":                {[]string{"--kafka-brokers", "k:9092"}, ""},
		"nats":                         {[]string{"--broker", "nats://127.0.0.1:4222", "--nats-key-token"}, ""},
		"nats cluster":                 {[]string{"--broker", "nats://a:4222,nats://b:4222"}, ""},
		"no broker at all":             {nil, "--kafka-brokers (OUTBOXD_KAFKA_BROKERS) or --broker is required"},
		"unknown scheme":               {[]string{"--broker", "mqtt://u:secret@h:1883"}, `--broker "mqtt://REDACTED@h:1883": unknown scheme (one of`},
		"both brokers":                 {[]string{"--broker", "nats://h:4222", "--kafka-brokers", "k:9092"}, "--broker and --kafka-brokers exclude each other"},
		"nats exactly-once":            {[]string{"--broker", "nats://h:4222", "--exactly-once"}, "--exactly-once is Kafka's transactional producer and has no NATS equivalent"},
		"nats replicas":                {[]string{"--broker", "nats://h:4222", "--nats-stream-replicas", "0"}, "--nats-stream-replicas must be between 1 and 5"},
		"nats bucket":                  {[]string{"--broker", "nats://h:4222", "--nats-progress-bucket", "a.b"}, `--nats-progress-bucket "a.b": a bucket name has only letters`},
		"kafka exactly-once ok":        {[]string{"--kafka-brokers", "k:9092", "--exactly-once"}, ""},
		"nats url as kafka":            {[]string{"--kafka-brokers", "nats://u:secret@127.0.0.1:4222"}, `--kafka-brokers takes Kafka's host:port pairs, not "nats://REDACTED@127.0.0.1:4222": for NATS JetStream use --broker nats://…`},
		"amqp url as kafka":            {[]string{"--kafka-brokers", "k:9092,amqp://h:5672"}, `for RabbitMQ use --broker amqp://…`},
		"kafka url scheme":             {[]string{"--kafka-brokers", "kafka://k:9092"}, `--kafka-brokers takes Kafka's host:port pairs, not "kafka://k:9092": write k:9092`},
		"kafka broker url":             {[]string{"--broker", "kafka://k1:9092,k2:9092"}, ""},
		"kafka url per broker":         {[]string{"--broker", "kafka://k1:9092,kafka://k2:9092", "--exactly-once"}, ""},
		"kafka url upper case":         {[]string{"--broker", "KAFKA://k1:9092/"}, ""},
		"kafka url and flag":           {[]string{"--broker", "kafka://k1:9092", "--kafka-brokers", "k:9092"}, "--broker and --kafka-brokers exclude each other"},
		"kafka url no host":            {[]string{"--broker", "kafka://"}, `--broker "kafka://" names no Kafka broker`},
		"kafka url user":               {[]string{"--broker", "kafka://u:secret@k:9092"}, "Kafka takes no user or password in the URL: SASL has its own --kafka-sasl-* options"},
		"kafka url path":               {[]string{"--broker", "kafka://k:9092/x"}, "a Kafka broker is host:port, with no path"},
		"kafka url mixed":              {[]string{"--broker", "kafka://k:9092,nats://h:4222"}, "nats:// in a kafka:// URL"},
		"kafka options checked":        {[]string{"--broker", "kafka://k:9092", "--topic-partitions", "0"}, "--topic-partitions and --topic-replication-factor must be positive"},
		"other broker ignores kafka's": {[]string{"--broker", "nats://h:4222", "--topic-partitions", "0"}, ""},
	}.run(t)
}

// runValidateCases are outboxd run command lines (after a --postgres) and
// what validate must say of each: want "" for valid, else a part of the
// error. No error may show the password "secret" the URLs carry.
type runValidateCases map[string]struct {
	args []string
	want string // "" valid
}

func (cases runValidateCases) run(t *testing.T) {
	t.Helper()
	pg := []string{"--postgres", "postgres://u@db/app"}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o, _, err := parseRun(t, append(pg, tc.args...), nil, "")
			if err != nil {
				t.Fatal(err)
			}
			err = o.validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid options refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			case strings.Contains(errString(err), "secret"):
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
