package outboxd_test

import (
	"context"
	"net/http"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink/kafka"
)

// Embedding the relay in a Go service (the README's example; compiled, not
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
