// Package router turns outbox events into broker records exactly the way
// Debezium's Outbox Event Router SMT does, configurable per table:
//
//   - topic: the route.by.field column through route.topic.regex and
//     route.topic.replacement (Kafka's RegexRouter; default
//     "outbox.event.<aggregatetype>"), validated as a Kafka topic name;
//   - key: the table.field.event.key column (default aggregateid), raw or
//     in JsonConverter's form (Config.KeyFormat);
//   - value: the table.field.event.payload column's bytes verbatim (bytea
//     decoded), or a JSON envelope when envelope placements are configured,
//     or a tombstone with route.tombstone.on.empty.payload;
//   - headers: the traceparent (and tracestate) of a child of the span
//     context in tracing.span.context.field when the row has one (first,
//     as Debezium's tracing runs before its router; tracing.go), "id"
//     always, then table.fields.additional.placement headers
//     (outboxd's default adds "type"), then the entries of the headers.field
//     jsonb column (e.g. W3C traceparent), then optional outboxd.* LSN
//     headers;
//   - timestamp: the transaction's commit time, or table.field.event.timestamp.
//
// It also routes table-less outbox events written with
// pg_logical_emit_message (RouteMessage) and builds dead-letter records
// (DeadLetter, DeadLetterMessage).
package router

import (
	"errors"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/outboxd/outboxd/wal"
)

// Header is one record header. A nil Value is a null header value.
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
	// Trace is set, with Config.Tracing, for an event a tracing sink spans
	// (tracing.go); nil otherwise.
	Trace *Trace
}

// Scratch is memory RouteInto builds a record into instead of allocating
// it: the bytes and header list of a record its caller is done with, so
// that a relay routing each event into the memory of one acked before
// costs no allocation per event (and its GC no scan of garbage). The zero
// value is empty and ready.
type Scratch struct {
	buf  []byte
	hdrs []Header
}

// take returns s's memory when it holds n bytes and nh headers, or new
// memory of that size (s may be nil).
func (s *Scratch) take(n, nh int) ([]byte, []Header) {
	if s != nil && cap(s.buf) >= n && cap(s.hdrs) >= nh {
		return s.buf[:0], s.hdrs[:0]
	}
	return make([]byte, 0, n), make([]Header, 0, nh)
}

// give keeps buf and hdrs, the memory a record was built into, in s for
// the next record, unless the two together are over keep bytes: then s
// keeps what it had. The header list counts too: a record of many short
// headers holds more in its list (headerBytes each) than in its bytes.
// The list's unused tail is cleared: it must not hold on to the bytes of a
// record built before (a buf that append had to grow).
func (s *Scratch) give(buf []byte, hdrs []Header, keep int) {
	if s == nil || cap(buf)+cap(hdrs)*headerBytes > keep {
		return
	}
	clear(hdrs[len(hdrs):cap(hdrs)])
	s.buf, s.hdrs = buf[:0], hdrs[:0]
}

// headerBytes is the memory of one Header in a header list.
const headerBytes = int(unsafe.Sizeof(Header{}))

// Size approximates the record's memory and wire footprint: its bytes plus
// HeaderOverhead per header.
func (r *Record) Size() int {
	n := len(r.Topic) + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + HeaderOverhead
	}
	return n
}

// Tx is what the router may use of the transaction a row belongs to.
type Tx struct {
	Xid        uint32
	CommitLSN  wal.LSN
	CommitTime time.Time
}

// InvalidError is an event that cannot be routed. It is never silently
// dropped: the caller decides between stopping and dead-lettering.
//
// Error() holds no value of the row but its id: the text reaches /status and
// /readyz, which anyone who can reach --http-addr may read. Detail, which
// quotes the offending value (cut short), goes to the log only (LogValue)
// and to the dead-letter record's outboxd.error header.
type InvalidError struct {
	Table   string // "schema.table", or "message:<prefix>" for a logical message
	EventID string // the event id, when it could be read (at most maxIDText bytes)
	Reason  string
	Detail  string // the offending value, quoted and cut short; "" if none
}

// maxIDText and maxValueText bound the row bytes an error may carry.
const (
	maxIDText    = 128
	maxValueText = 64
)

// idText is an event id as errors show it.
func idText(b []byte) string {
	if len(b) > maxIDText {
		return string(b[:maxIDText]) + "…"
	}
	return string(b)
}

// quoteValue quotes a value for InvalidError.Detail, cut to maxValueText bytes.
func quoteValue(b []byte) string {
	if len(b) > maxValueText {
		return strconv.Quote(string(b[:maxValueText])) + "… (" + strconv.Itoa(len(b)) + " bytes)"
	}
	return strconv.Quote(string(b))
}

// LogValue is the error with its Detail, for the log.
func (e *InvalidError) LogValue() slog.Value {
	if e.Detail == "" {
		return slog.StringValue(e.Error())
	}
	return slog.StringValue(e.Error() + " (" + e.Detail + ")")
}

// FullText is Error() with Detail.
func (e *InvalidError) FullText() string { return e.LogValue().String() }

func (e *InvalidError) Error() string {
	var b strings.Builder
	b.WriteString("outbox event in ")
	b.WriteString(e.Table)
	if e.EventID != "" {
		b.WriteString(" (id ")
		b.WriteString(e.EventID)
		b.WriteString(")")
	}
	b.WriteString(" cannot be routed: ")
	b.WriteString(e.Reason)
	return b.String()
}

// ErrInvalid matches every *InvalidError with errors.Is.
var ErrInvalid = errors.New("invalid outbox event")

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Router routes outbox events.
//
// A Router is NOT safe for concurrent use: it caches per-relation plans,
// topic names and header keys without locks, because it is meant to be used
// by the single goroutine that reads the replication stream. Every method,
// including InvalidOpBehavior and DeadLetter, must be called from that
// goroutine (or with external synchronisation).
type Router struct {
	lsnHeaders bool
	tracing    bool
	msgPrefix  string
	msgTable   string // "message:<prefix>"
	defaults   *settings
	tables     map[string]*settings

	reservedTopics   []string
	reservedPrefixes []string
	allow            []string
	maxRecord        int // 0: no bound
	maxHeaders       int

	last  *plan // the plan of the previous row: the common case
	plans map[*wal.Relation]*plan
	keys  map[string]string // interned header keys from headers columns
	bin   binRow            // a binary row's text form (binary.go)
	exp   []byte            // scratch for table.expand.json.payload (expand.go)

	ceBinding CEBinding // CloudEvents' binary-mode attribute names
}

const (
	maxPlans      = 1024
	maxHeaderKeys = 256
)

// New validates cfg and builds a Router. Every problem is reported at once,
// each naming the table ("defaults" for Config.Defaults) and the option.
func New(cfg Config) (*Router, error) {
	var errs []error
	r := &Router{
		lsnHeaders: cfg.LSNHeaders,
		tracing:    cfg.Tracing,
		msgPrefix:  cfg.MessagePrefix,
		msgTable:   "message:" + cfg.MessagePrefix,
		tables:     make(map[string]*settings, len(cfg.Tables)),
		plans:      make(map[*wal.Relation]*plan),
		keys:       make(map[string]string),

		reservedTopics:   nonEmpty(cfg.ReservedTopics),
		reservedPrefixes: nonEmpty(cfg.ReservedTopicPrefixes),
		allow:            nonEmpty(cfg.TopicAllow),
		maxRecord:        cfg.MaxRecordBytes,
		maxHeaders:       cfg.MaxHeaders,
	}
	if r.maxHeaders <= 0 {
		r.maxHeaders = DefaultMaxHeaders
	}
	// Config.KeyFormat is the bottom layer of key.format: router: and
	// tables: override it.
	base := Options{}
	switch strings.TrimSpace(cfg.KeyFormat) {
	case "", keyFormatRaw:
	case keyFormatJSONStr:
		base[optKeyFormat] = keyFormatJSONStr
	default:
		errs = append(errs, errors.New(`key format: "`+cfg.KeyFormat+`" is not one of raw, json-string`))
	}
	r.ceBinding = cfg.CloudEvents.Binding
	if r.ceBinding.Prefix == "" {
		r.ceBinding = CEKafka
	}
	if err := ceBase(cfg.CloudEvents, base); err != nil {
		errs = append(errs, err)
	}
	var es []error
	r.defaults, es = resolve(defaultsName, base, cfg.Defaults)
	errs = append(errs, es...)
	r.defaults.hdrGuard = newHeaderGuard(r.defaults, r.maxHeaders)
	names := make([]string, 0, len(cfg.Tables))
	for name := range cfg.Tables {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		where := "table " + name
		if i := strings.IndexByte(name, '.'); i <= 0 || i == len(name)-1 {
			errs = append(errs, errors.New(where+`: table names must be "schema.table"`))
			continue
		}
		s, es := resolve(where, base, cfg.Defaults, cfg.Tables[name])
		if len(es) > 0 {
			// Report only what the table adds: the defaults' own problems
			// are reported once, under "defaults".
			_, defErrs := resolve(where, base, cfg.Defaults)
			errs = append(errs, tableOnly(es, defErrs)...)
			continue
		}
		if r.defaults.topic != nil && !overridesTopic(cfg.Tables[name]) {
			s.topic = r.defaults.topic // share the topic cache
		}
		s.name = name
		s.hdrGuard = newHeaderGuard(s, r.maxHeaders)
		r.tables[name] = s
	}
	if len(errs) > 0 {
		return nil, errors.Join(append([]error{errors.New("router: invalid configuration")}, errs...)...)
	}
	return r, nil
}

// nonEmpty drops blank entries of a list option.
func nonEmpty(list []string) []string {
	var out []string
	for _, s := range list {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// tableOnly drops the errors that come from the defaults alone (already
// reported once under "defaults").
func tableOnly(all, fromDefaults []error) []error {
	seen := make(map[string]bool, len(fromDefaults))
	for _, e := range fromDefaults {
		seen[e.Error()] = true
	}
	var out []error
	for _, e := range all {
		if !seen[e.Error()] {
			out = append(out, e)
		}
	}
	return out
}

// overridesTopic: the table sets its own topic rule.
func overridesTopic(table Options) bool {
	_, re := table[optTopicRegex]
	_, rp := table[optTopicReplace]
	return re || rp
}

// settingsFor returns the options in force for a table.
func (r *Router) settingsFor(qualified string) *settings {
	if s, ok := r.tables[qualified]; ok {
		return s
	}
	return r.defaults
}

// InvalidOpBehavior is the table.op.invalid.behavior of rel's table: "warn"
// (default) or "error" (log at that level and skip the UPDATE), or "fatal"
// (stop: the slot must not advance past the UPDATE). DELETEs are always
// skipped silently, as in Debezium.
func (r *Router) InvalidOpBehavior(rel *wal.Relation) string {
	return r.planFor(rel).s.invalidOp
}
