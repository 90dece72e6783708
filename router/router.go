// Package router turns an outbox row into a broker record the way Debezium's
// Outbox Event Router does: topic from the routing column, key from the
// aggregate id, the payload column's bytes verbatim as the value, and the event
// id (and type) as headers.
package router

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/wal"
)

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is a routed event, independent of the broker that carries it.
type Record struct {
	Topic     string
	Key       []byte // nil: no key
	Value     []byte // nil: a null value (a tombstone on compacted topics)
	Headers   []Header
	Timestamp time.Time
	Partition int32 // -1: the producer picks the partition from the key
}

// Size approximates the record's memory and wire footprint.
func (r *Record) Size() int {
	n := len(r.Topic) + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// Tx is what the router may use of the transaction a row belongs to.
type Tx struct {
	Xid        uint32
	CommitLSN  wal.LSN
	CommitTime time.Time
}

// InvalidError is a row that cannot be routed. It is never silently dropped:
// the caller decides between stopping and dead-lettering.
type InvalidError struct {
	Table  string
	Reason string
}

func (e *InvalidError) Error() string { return fmt.Sprintf("outbox row in %s cannot be routed: %s", e.Table, e.Reason) }

// ErrInvalid matches every *InvalidError with errors.Is.
var ErrInvalid = errors.New("invalid outbox row")

func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Config holds the routing options (Debezium's names).
type Config struct {
	IDField      string // table.field.event.id
	KeyField     string // table.field.event.key
	PayloadField string // table.field.event.payload
	RouteBy      string // route.by.field
	TopicPrefix  string
	TypeField    string // emitted as the "type" header
}

// Defaults are Debezium's defaults.
func Defaults() Config {
	return Config{IDField: "id", KeyField: "aggregateid", PayloadField: "payload", RouteBy: "aggregatetype", TopicPrefix: "outbox.event.", TypeField: "type"}
}

// Router routes rows. It is safe for concurrent use once built.
type Router struct {
	cfg Config
}

// New validates cfg and builds a Router.
func New(cfg Config) (*Router, error) {
	return &Router{cfg: cfg}, nil
}

// Route builds the record for an inserted outbox row. The record owns its
// bytes: nothing aliases the row, which is reused by the stream.
func (r *Router) Route(row *wal.Row, tx Tx) (Record, error) {
	table := row.Relation.QualifiedName()
	invalid := func(format string, args ...any) (Record, error) {
		return Record{}, &InvalidError{Table: table, Reason: fmt.Sprintf(format, args...)}
	}
	route, ok := row.Get(r.cfg.RouteBy)
	if !ok {
		return invalid("no column %q (route.by.field)", r.cfg.RouteBy)
	}
	if route.IsNull() || len(route.Data) == 0 {
		return invalid("routing column %q is NULL or empty", r.cfg.RouteBy)
	}
	id, ok := row.Get(r.cfg.IDField)
	if !ok {
		return invalid("no column %q (table.field.event.id)", r.cfg.IDField)
	}
	if id.IsNull() {
		return invalid("event id column %q is NULL", r.cfg.IDField)
	}
	payload, ok := row.Get(r.cfg.PayloadField)
	if !ok {
		return invalid("no column %q (table.field.event.payload)", r.cfg.PayloadField)
	}
	key, _ := row.Get(r.cfg.KeyField)
	typ, hasType := row.Get(r.cfg.TypeField)

	// One allocation holds every byte the record keeps.
	n := len(key.Data) + len(payload.Data) + len(id.Data) + len(typ.Data)
	buf := make([]byte, 0, n)
	rec := Record{
		Topic:     r.cfg.TopicPrefix + string(route.Data),
		Timestamp: tx.CommitTime,
		Partition: -1,
	}
	buf, rec.Key = appendValue(buf, key)
	buf, rec.Value = appendValue(buf, payload)
	hdrs := make([]Header, 1, 2)
	buf, hdrs[0].Value = appendValue(buf, id)
	hdrs[0].Key = "id"
	if hasType && !typ.IsNull() {
		var v []byte
		_, v = appendValue(buf, typ)
		hdrs = append(hdrs, Header{Key: "type", Value: v})
	}
	rec.Headers = hdrs
	return rec, nil
}

// appendValue copies v's bytes into buf and returns the copy (nil for NULL).
func appendValue(buf []byte, v wal.Value) ([]byte, []byte) {
	if v.IsNull() {
		return buf, nil
	}
	start := len(buf)
	buf = append(buf, v.Data...)
	return buf, buf[start:len(buf):len(buf)]
}
