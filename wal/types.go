package wal

import (
	"time"

	"github.com/jackc/pglogrepl"
)

// LSN is a PostgreSQL write-ahead log position.
type LSN = pglogrepl.LSN

// ParseLSN parses the textual form "16/B374D848".
func ParseLSN(s string) (LSN, error) { return pglogrepl.ParseLSN(s) }

// Kind says which protocol message a Msg carries.
type Kind uint8

const (
	KindBegin     Kind = iota + 1 // a committed transaction starts
	KindInsert                    // Row holds the new tuple
	KindUpdate                    // Row holds the new tuple
	KindDelete                    // Row holds the key or old tuple
	KindTruncate                  // Truncated lists the relations
	KindMessage                   // a pg_logical_emit_message message
	KindCommit                    // the transaction ends
	KindKeepalive                 // the server's keepalive; no data
)

var kindNames = [...]string{"", "begin", "insert", "update", "delete", "truncate", "message", "commit", "keepalive"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Column describes one column of a relation as pgoutput announced it.
type Column struct {
	Name    string
	TypeOID uint32
	Key     bool // part of the replica identity
}

// Relation is a table as last announced by a pgoutput Relation message. A
// schema change (ALTER TABLE) mid-stream produces a new *Relation; rows keep
// pointing at the one that was current when they were decoded.
type Relation struct {
	ID        uint32
	Namespace string
	Name      string
	Columns   []Column
	index     map[string]int
}

// QualifiedName is "schema.table".
func (r *Relation) QualifiedName() string { return r.Namespace + "." + r.Name }

// ColumnIndex returns the position of the named column, or -1.
func (r *Relation) ColumnIndex(name string) int {
	if i, ok := r.index[name]; ok {
		return i
	}
	return -1
}

// Value kinds, as pgoutput's TupleData encodes them.
const (
	ValueNull      = 'n'
	ValueUnchanged = 'u' // an unchanged TOASTed value: the data is not sent
	ValueText      = 't'
	ValueBinary    = 'b'
)

// Value is one column's value. Data is the value's text form exactly as the
// server sent it (Kind ValueText), or in binary mode (StartOptions.Binary)
// its binary send form (Kind ValueBinary). It aliases the receive buffer: it is valid only until the
// next call to Stream.Next, so copy what you keep.
type Value struct {
	Kind byte
	Data []byte
}

// IsNull reports whether the value is SQL NULL (or was not sent).
func (v Value) IsNull() bool { return v.Kind != ValueText && v.Kind != ValueBinary }

// Row is one tuple of an Insert, Update or Delete. Values line up with
// Relation.Columns.
type Row struct {
	Relation *Relation
	Values   []Value
	// Oversize is the protocol message's body length when it exceeded
	// StartOptions.MaxBodyBytes: the stream read only its start, so Values
	// holds only the columns that fit (possibly none). 0 otherwise.
	Oversize int
}

// Get returns the named column's value and whether the relation has it.
func (r *Row) Get(name string) (Value, bool) {
	i := r.Relation.ColumnIndex(name)
	if i < 0 || i >= len(r.Values) {
		return Value{}, false
	}
	return r.Values[i], true
}

// Begin starts a committed transaction. pgoutput sends a transaction only once
// it has committed, so FinalLSN and CommitTime are already known here.
type Begin struct {
	FinalLSN   LSN // the commit record's LSN
	CommitTime time.Time
	Xid        uint32
}

// Commit ends a transaction. EndLSN is what a client confirms once it has
// durably handled everything in the transaction.
type Commit struct {
	CommitLSN  LSN
	EndLSN     LSN
	CommitTime time.Time
}

// Message is a logical decoding message written by pg_logical_emit_message.
type Message struct {
	Transactional bool
	LSN           LSN
	Prefix        string
	Content       []byte // aliases the receive buffer, like Value.Data
	// Oversize is as Row.Oversize: Content is only the start of the content.
	Oversize int
}

// Keepalive is the server's periodic ping. WALEnd is how far the server has
// decoded; everything committed before it has already been sent.
type Keepalive struct {
	WALEnd         LSN
	ServerTime     time.Time
	ReplyRequested bool
}

// Msg is one decoded message. Only the field matching Kind is meaningful.
// Next reuses the Msg's storage, so it is valid until the next call.
type Msg struct {
	Kind      Kind
	WALStart  LSN // position of the XLogData that carried the message
	Begin     Begin
	Commit    Commit
	Row       Row
	Truncated []*Relation
	Message   Message
	Keepalive Keepalive
}

// NewRelation builds a Relation, as the decoder does from a Relation message.
// Tests and tools that synthesise rows use it.
func NewRelation(id uint32, namespace, name string, cols []Column) *Relation {
	r := &Relation{ID: id, Namespace: namespace, Name: name, Columns: cols, index: make(map[string]int, len(cols))}
	for i, c := range cols {
		r.index[c.Name] = i
	}
	return r
}
