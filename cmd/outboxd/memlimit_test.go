package main

import (
	"io"
	"log/slog"
	"testing"
)

// NATS and RabbitMQ lower --max-inflight-events (to 8192, 4096) when it is
// left at its default (16384), never when it is set, by flag or environment.
func TestLowerInflightDefault(t *testing.T) {
	for _, tc := range []struct {
		name, broker string
		args         []string
		env          map[string]string
		want         int
	}{
		{"nats default", "nats://127.0.0.1:4222", nil, nil, natsMaxInflight},
		{"rabbitmq default", "amqp://127.0.0.1:5672/", nil, nil, rabbitMaxInflight},
		{"nats set higher", "nats://127.0.0.1:4222", []string{"--max-inflight-events", "20000"}, nil, 20000},
		{"nats set lower", "nats://127.0.0.1:4222", []string{"--max-inflight-events", "4000"}, nil, 4000},
		{"rabbitmq from the environment", "amqp://127.0.0.1:5672/", nil, map[string]string{"OUTBOXD_MAX_INFLIGHT_EVENTS": "30000"}, 30000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o runOptions
			args := append([]string{"--postgres", "host=x", "--broker", tc.broker}, tc.args...)
			e := env{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return tc.env[k] }}
			if _, err := o.load(e, args); err != nil {
				t.Fatal(err)
			}
			b := brokerRun{Opts: &o, Log: slog.New(slog.DiscardHandler)}
			switch bo := o.BrokerOpts[tc.broker[:4]].(type) {
			case *natsOptions:
				lowerInflightDefault(bo.fs, b, natsMaxInflight, "nats")
			case *rabbitOptions:
				lowerInflightDefault(bo.fs, b, rabbitMaxInflight, "rabbitmq")
			default:
				t.Fatalf("broker options %T", bo)
			}
			if o.MaxInflightEvents != tc.want {
				t.Fatalf("--max-inflight-events %d, want %d", o.MaxInflightEvents, tc.want)
			}
		})
	}
	if natsMaxInflight != 8192 || rabbitMaxInflight != 4096 {
		t.Fatalf("nats %d, rabbitmq %d: the help text of --max-inflight-events says 8192 and 4096", natsMaxInflight, rabbitMaxInflight)
	}
}
