// Package schema owns outboxd's schema-registry stage: after the router has
// made a record, an [Encoder] checks the JSON payload against the value schema
// a Confluent-compatible registry holds (Confluent Schema Registry, Apicurio
// Registry's ccompat API, Redpanda, Karapace) and replaces it with the
// Confluent wire format: a zero magic byte, the schema id as 4 big-endian
// bytes, then the body — Avro binary for an AVRO schema (avro.go), the JSON
// bytes themselves for a JSON schema (jsonschema.go), the message indexes
// and the binary message for a PROTOBUF one (protobuf.go). Consumers decode it with any stock
// Confluent-format deserializer, or with this package's [Decoder].
//
// The stage decides three things for the relay (the root package's
// Config.Encoder is a sink.Encoder):
//
//   - which schema: by subject strategy (topic: "<topic>-value"; record:
//     the record's name; topic-record: "<topic>-<record>"), the subject's
//     latest version unless a pin per table or event type names a version
//     or a schema id;
//   - what a payload that does not fit is: a *router.InvalidError naming
//     the field, which takes the relay's --on-invalid path (hold or dead
//     letter) like any row the router cannot route;
//   - what an unreachable registry is: any other error, which ends the
//     replication session like a broker outage: nothing past the event is
//     confirmed, /readyz shows the error, the relay reconnects with backoff
//     and delivers from the event on, in order.
//
// Schemas are cached by id for good (a schema id never changes meaning) and a
// subject's latest version for Config.Refresh, so an event costs no network
// round trip; a registry that is down when the latest version is due for a
// refresh keeps the cached one.
package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// Strategy names a record's subject, as Confluent's serializers do
// (value.subject.name.strategy).
type Strategy int

const (
	// TopicName: "<topic>-value" (Confluent's TopicNameStrategy, the default).
	TopicName Strategy = iota
	// RecordName: the record's full name (RecordNameStrategy).
	RecordName
	// TopicRecordName: "<topic>-<record>" (TopicRecordNameStrategy).
	TopicRecordName
)

var strategyWords = []string{TopicName: "topic", RecordName: "record", TopicRecordName: "topic-record"}

func (s Strategy) String() string {
	if int(s) < len(strategyWords) {
		return strategyWords[s]
	}
	return fmt.Sprintf("Strategy(%d)", int(s))
}

// ParseStrategy reads "topic", "record" or "topic-record".
func ParseStrategy(s string) (Strategy, error) {
	for i, w := range strategyWords {
		if w == s {
			return Strategy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown subject strategy %q: want %s", s, strings.Join(strategyWords, ", "))
}

// Pin chooses the schema of a table's or an event type's records instead of
// the strategy's subject at its latest version.
type Pin struct {
	ID      int    // a schema id: this exact schema (Subject and Version are ignored)
	Subject string // "" : the strategy's subject
	Version int    // 0: the subject's latest version
	Record  string // the record name the record strategies use ("": the event type)
}

// Config configures an Encoder.
type Config struct {
	Client   *sr.Client
	Strategy Strategy
	// Tables and Types pin schemas by source table ("schema.table", or
	// "message:<prefix>" for the table-less outbox) and by event type (the
	// TypeHeader header's value); a type's pin wins over its table's.
	Tables map[string]Pin
	Types  map[string]Pin
	// TypeHeader is the header holding the event type (router's default
	// "type"): the record name of the record strategies, and the key of Types.
	TypeHeader string
	// Refresh is how long a subject's latest version is used before it is
	// looked up again (5m); a pinned version or id is never looked up again.
	Refresh time.Duration
	// Timeout bounds one registry request (10s).
	Timeout time.Duration
}

// Encoder encodes record values for the registry. It is the sink.Encoder of
// the relay, called from its single streaming goroutine; its caches are
// locked all the same (uncontended, so cheap), making it safe to share.
type Encoder struct {
	cfg Config
	reg *registry

	mu     sync.Mutex
	latest map[string]*latest // by subject
	exact  map[exactKey]*parsed
}

var _ sink.Encoder = (*Encoder)(nil)

type latest struct {
	p  *parsed
	at time.Time
}

type exactKey struct {
	subject string
	version int
}

// New returns an Encoder; it contacts the registry only when it meets a
// record (Check asks it up front).
func New(cfg Config) (*Encoder, error) {
	if cfg.Client == nil {
		return nil, errors.New("schema: Config.Client is nil")
	}
	if cfg.TypeHeader == "" {
		cfg.TypeHeader = "type"
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 5 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if _, err := ParseStrategy(cfg.Strategy.String()); err != nil {
		return nil, err
	}
	return &Encoder{cfg: cfg, reg: newRegistry(cfg.Client, cfg.Timeout), latest: map[string]*latest{}, exact: map[exactKey]*parsed{}}, nil
}

// Check lists the registry's subjects: a wrong URL, credentials or
// certificate fail here, at startup, with the reason.
func (e *Encoder) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if _, err := e.cfg.Client.Subjects(ctx); err != nil {
		return registryErr("listing subjects", err)
	}
	return nil
}

// Encode replaces rec.Value, a JSON payload, with its Confluent wire
// format. A null value stays null (a tombstone is no payload). It returns a
// *router.InvalidError when the payload does not match its schema, and any
// other error when the registry could not give the schema.
func (e *Encoder) Encode(ctx context.Context, source string, rec *router.Record) error {
	if rec.Value == nil {
		return nil
	}
	p, record, err := e.schemaFor(ctx, source, rec)
	if err != nil {
		return err
	}
	out, err := p.encode(rec.Value, record)
	if err != nil {
		return &router.InvalidError{Table: source, EventID: header(rec.Headers, "id"),
			Reason: fmt.Sprintf("the payload does not match %s: %s", p, err), Detail: detail(err)}
	}
	rec.Value = out
	return nil
}

// schemaFor picks and fetches (or finds cached) the schema of rec, and
// names the record (Protobuf: the message) to encode: the pin's, or with
// the record strategies the event type; "" for the schema's first.
func (e *Encoder) schemaFor(ctx context.Context, source string, rec *router.Record) (p *parsed, record string, err error) {
	typ := header(rec.Headers, e.cfg.TypeHeader)
	pin, ok := e.cfg.Types[typ]
	if !ok || typ == "" {
		pin = e.cfg.Tables[source]
	}
	record = pin.Record
	if record == "" && e.cfg.Strategy != TopicName {
		record = typ
	}
	if pin.ID > 0 {
		p, err = e.reg.byID(ctx, pin.ID)
		return p, record, err
	}
	subject := pin.Subject
	if subject == "" {
		switch e.cfg.Strategy {
		case TopicName:
			subject = rec.Topic + "-value"
		case RecordName, TopicRecordName:
			if record == "" {
				return nil, "", &router.InvalidError{Table: source, EventID: header(rec.Headers, "id"),
					Reason: fmt.Sprintf("the %s subject strategy names the subject after the event type, and the event has no %q header; pin a subject or record for the table", e.cfg.Strategy, e.cfg.TypeHeader)}
			}
			subject = record
			if e.cfg.Strategy == TopicRecordName {
				subject = rec.Topic + "-" + record
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if pin.Version > 0 {
		k := exactKey{subject, pin.Version}
		if p := e.exact[k]; p != nil {
			return p, record, nil
		}
		p, err := e.reg.bySubject(ctx, subject, pin.Version)
		if err != nil {
			return nil, "", err
		}
		e.exact[k] = p
		return p, record, nil
	}
	l := e.latest[subject]
	if l != nil && time.Since(l.at) < e.cfg.Refresh {
		return l.p, record, nil
	}
	p, err = e.reg.bySubject(ctx, subject, -1)
	if err != nil {
		if l != nil {
			// The registry is away: the version we have still holds, and
			// the next try waits a while, or every event would wait for a
			// registry that hangs.
			l.at = time.Now().Add(min(e.cfg.Refresh, refreshRetry) - e.cfg.Refresh)
			return l.p, record, nil
		}
		return nil, "", err
	}
	e.latest[subject] = &latest{p: p, at: time.Now()}
	return p, record, nil
}

// refreshRetry is the wait before a failed refresh of a subject's latest
// version is tried again.
const refreshRetry = 10 * time.Second

func header(hs []router.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// registry fetches and parses schemas, caching them by id.
type registry struct {
	cl      *sr.Client
	timeout time.Duration
	mu      sync.Mutex
	ids     map[int]*parsed
}

func newRegistry(cl *sr.Client, timeout time.Duration) *registry {
	return &registry{cl: cl, timeout: timeout, ids: map[int]*parsed{}}
}

// RegistryError is a schema the registry could not give: unreachable,
// refusing the credentials, no such subject or version, or a schema outboxd
// cannot use. The relay holds delivery at the event and retries with
// backoff: each of these is fixed on the registry's side, not in the row.
type RegistryError struct {
	Op  string // what was asked ("subject orders-value, latest version")
	Err error
}

func (e *RegistryError) Error() string {
	return "schema registry: " + e.Op + ": " + e.Err.Error() + "; " + fixFor(e.Err)
}

func (e *RegistryError) Unwrap() error { return e.Err }

func fixFor(err error) string {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch re.StatusCode {
		case 401, 403:
			return "fix: check --schema-registry-user/--schema-registry-password or --schema-registry-token (delivery waits here and resumes once the registry accepts them)"
		case 404:
			return "fix: register the schema (or correct the subject strategy or pin); delivery waits here and resumes once the registry has it"
		}
	}
	if errors.Is(err, errUnusable) {
		return "fix: register a schema outboxd can use under the subject, or pin another one"
	}
	return "fix: check that the registry at --schema-registry-url is up and reachable; delivery waits here and resumes in order once it answers"
}

func registryErr(op string, err error) error { return &RegistryError{Op: op, Err: err} }

var errUnusable = errors.New("schema not usable")

func (r *registry) byID(ctx context.Context, id int) (*parsed, error) {
	r.mu.Lock()
	p := r.ids[id]
	r.mu.Unlock()
	if p != nil {
		return p, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	s, err := r.cl.SchemaByID(ctx, id)
	if err != nil {
		return nil, registryErr(fmt.Sprintf("schema id %d", id), err)
	}
	return r.parse(ctx, sr.SubjectSchema{ID: id, Schema: s})
}

func (r *registry) bySubject(ctx context.Context, subject string, version int) (*parsed, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	ss, err := r.cl.SchemaByVersion(ctx, subject, version)
	if err != nil {
		v := "latest version"
		if version > 0 {
			v = fmt.Sprintf("version %d", version)
		}
		return nil, registryErr(fmt.Sprintf("subject %s, %s", subject, v), err)
	}
	r.mu.Lock()
	p := r.ids[ss.ID]
	r.mu.Unlock()
	if p != nil {
		return p, nil
	}
	return r.parse(ctx, ss)
}

// parse compiles a fetched schema and caches it under its id.
func (r *registry) parse(ctx context.Context, ss sr.SubjectSchema) (*parsed, error) {
	p := &parsed{id: ss.ID, subject: ss.Subject, version: ss.Version, typ: ss.Type}
	op := fmt.Sprintf("schema id %d", ss.ID)
	switch ss.Type {
	case sr.TypeAvro:
		// Named types of references first, in one cache per schema: two
		// versions of a record with the same name must not meet.
		cache := &avro.SchemaCache{}
		for _, ref := range ss.References {
			rs, err := r.cl.SchemaByVersion(ctx, ref.Subject, ref.Version)
			if err != nil {
				return nil, registryErr(fmt.Sprintf("%s's reference %s (subject %s version %d)", op, ref.Name, ref.Subject, ref.Version), err)
			}
			if _, err := avro.ParseWithCache(rs.Schema.Schema, "", cache); err != nil {
				return nil, registryErr(op, fmt.Errorf("%w: reference %s does not parse as Avro: %v", errUnusable, ref.Name, err))
			}
		}
		s, err := avro.ParseWithCache(ss.Schema.Schema, "", cache)
		if err != nil {
			return nil, registryErr(op, fmt.Errorf("%w: does not parse as Avro: %v", errUnusable, err))
		}
		p.avro = s
	case sr.TypeJSON:
		if len(ss.References) > 0 {
			return nil, registryErr(op, fmt.Errorf("%w: JSON schemas with references are not supported", errUnusable))
		}
		s, err := compileJSONSchema(ss.ID, ss.Schema.Schema)
		if err != nil {
			return nil, registryErr(op, fmt.Errorf("%w: does not compile as a JSON schema: %v", errUnusable, err))
		}
		p.json = s
	case sr.TypeProtobuf:
		fd, err := r.protoFile(ctx, ss, op)
		if err != nil {
			return nil, err
		}
		p.proto = fd
	default:
		return nil, registryErr(op, fmt.Errorf("%w: a %s schema; outboxd encodes AVRO, JSON and PROTOBUF schemas", errUnusable, ss.Type))
	}
	r.mu.Lock()
	r.ids[ss.ID] = p
	r.mu.Unlock()
	return p, nil
}

// parsed is a compiled schema.
type parsed struct {
	id      int
	subject string
	version int
	typ     sr.SchemaType
	avro    avro.Schema
	json    *jsonschema.Schema
	proto   protoreflect.FileDescriptor
}

func (p *parsed) String() string {
	if p.subject == "" {
		return fmt.Sprintf("%s schema id %d", p.typ, p.id)
	}
	return fmt.Sprintf("%s schema id %d (subject %s version %d)", p.typ, p.id, p.subject, p.version)
}

// encode validates a JSON payload and returns its wire format; record
// picks a Protobuf schema's message ("": its first).
func (p *parsed) encode(payload []byte, record string) ([]byte, error) {
	if p.proto != nil {
		return encodeProto(p.proto, p.id, record, payload)
	}
	out := make([]byte, 5, 5+len(payload))
	out[1], out[2], out[3], out[4] = byte(p.id>>24), byte(p.id>>16), byte(p.id>>8), byte(p.id)
	v, err := decodeJSON(payload)
	if err != nil {
		return nil, &mismatch{msg: "not JSON: " + err.Error()}
	}
	if p.avro != nil {
		return appendAvro(out, p.avro, v, "")
	}
	if err := validateJSON(p.json, v); err != nil {
		return nil, err
	}
	return append(out, payload...), nil
}
