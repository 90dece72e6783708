package main

import (
	"strings"

	"github.com/outboxd/outboxd/sink/kafka"
)

// transactionalID is the exactly-once producer's transactional id for the
// checkpoint key "<system id>/<slot>" (sysid.Key): one per
// database and slot, so instances of different databases with the same
// slot name never fence each other on a shared Kafka cluster.
func transactionalID(o runOptions, key string) string {
	sys, _, _ := strings.Cut(key, "/")
	return kafka.TransactionalID(o.TransactionalIDPrefix, sys, o.Slot)
}
