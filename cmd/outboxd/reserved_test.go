package main

import (
	"errors"
	"testing"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// outboxd's own topics, custom names included, are reserved even with no
// reserved prefix: a row routed by value into the progress topic could
// forge the progress record (0/0 disables the missing-slot check, a high
// LSN stops outboxd). On main only the checkpoint and dead-letter topics
// were (issue 22, item 3).
func TestOwnTopicsReserved(t *testing.T) {
	file := "router:\n  route.topic.replacement: \"${routedByValue}\"\n"
	o, set, err := parseRun(t, []string{"--progress-topic", "acme.progress", "--checkpoint-topic", "acme.checkpoints",
		"--dead-letter-topic", "acme.dlq", "--reserved-topic-prefixes", "__"}, nil, file)
	if err != nil {
		t.Fatal(err)
	}
	defaults, tables, err := router.ConfigFromYAML(set.sections["router"], set.sections["tables"])
	if err != nil {
		t.Fatal(err)
	}
	rt, err := router.New(routerConfig(o, defaults, tables))
	if err != nil {
		t.Fatal(err)
	}
	rel := wal.NewRelation(1, "public", "outbox", []wal.Column{
		{Name: "id", TypeOID: 2950}, {Name: "aggregatetype", TypeOID: 25}, {Name: "aggregateid", TypeOID: 25},
		{Name: "type", TypeOID: 25}, {Name: "payload", TypeOID: 3802}})
	route := func(topic string) error {
		row := &wal.Row{Relation: rel}
		for _, v := range []string{"4d47e8a2-6b1c-4c1e-9a43-0f2d6c1b7a11", topic, "k", "T", "{}"} {
			row.Values = append(row.Values, wal.Value{Kind: wal.ValueText, Data: []byte(v)})
		}
		_, err := rt.Route(row, router.Tx{Xid: 1, CommitLSN: 0x16B3748})
		return err
	}
	for _, topic := range []string{"acme.progress", "acme.checkpoints", "acme.dlq"} {
		var inv *router.InvalidError
		if err := route(topic); !errors.As(err, &inv) {
			t.Errorf("routed into %s: err = %v, want an invalid event", topic, err)
		}
	}
	if err := route("acme.orders"); err != nil {
		t.Errorf("acme.orders: %v", err)
	}
}
