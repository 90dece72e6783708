package outboxd_test

import (
	"context"
	"net/http"
	"strings"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink/kafka"
)

// Embedding the relay in a Go service (docs/architecture.md's example; compiled, not
// run: it needs PostgreSQL and Kafka).
func Example() {
	ctx := context.Background()
	dsn, brokers := "postgres://outboxd@db/app?sslmode=verify-full", []string{"kafka:9092"}
	rt, _ := router.New(router.Config{})               // Debezium defaults
	sk, _ := kafka.New(kafka.Config{Brokers: brokers}) // idempotent, acks=all
	r, _ := outboxd.New(outboxd.Config{Postgres: dsn, Router: rt, Sink: sk})
	go http.ListenAndServe("127.0.0.1:9187", r.Handler(false))
	_ = r.Run(ctx) // until ctx ends; then drains and confirms
}

// Exactly-once: the Kafka sink is transactional, and Checkpoints binds it to
// the checkpoint record the engine names at startup ("<system id>/<slot>").
func Example_exactlyOnce() {
	ctx := context.Background()
	dsn := "postgres://outboxd@db/app?sslmode=verify-full"
	rt, _ := router.New(router.Config{})
	sk, _ := kafka.New(kafka.Config{Brokers: []string{"kafka:9092"}, Transactional: &kafka.Transactional{}})
	r, _ := outboxd.New(outboxd.Config{
		Postgres: dsn, Router: rt, Sink: sk,
		Delivery: outboxd.ExactlyOnce, TxnSink: sk,
		Checkpoints: func(ctx context.Context, b outboxd.CheckpointBinding) error {
			cp := kafka.Checkpoints{Topic: "outboxd.checkpoints", Key: b.Key, Check: b.Check,
				TransactionalID: kafka.TransactionalID(kafka.DefaultTransactionalIDPrefix, strings.SplitN(b.Key, "/", 2)[0], "outboxd")}
			if !b.Register { // another instance streams: registering would fence it
				return sk.UseCheckpoints(cp)
			}
			return sk.InitTransactions(ctx, cp)
		},
	})
	go http.ListenAndServe("127.0.0.1:9187", r.Handler(false)) // /readyz: "starting: …" while it waits for Kafka
	_ = r.Run(ctx)
}
