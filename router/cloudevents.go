package router

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/wal"
)

// CloudEvents (https://cloudevents.io, spec 1.0): with the option envelope
// set to cloudevents (--envelope, or per table), every routed record is also
// a CloudEvent:
//
//   - id: the event id; source: cloudevents.source (--cloudevents-source);
//     specversion: 1.0; type: the table.field.event.type column (or, when
//     the table has no such column, the column a header placement names
//     "type"); subject: the aggregate id (the key column's text; absent when
//     NULL); time: the record's timestamp (the commit time, or
//     table.field.event.timestamp's column) in RFC 3339, UTC;
//   - datacontenttype: from the payload column's type: json/jsonb (and
//     outboxd's JSON envelope or value.format json-string) application/json,
//     bytea application/octet-stream, anything else text/plain;
//   - extension attributes: the header placements of
//     table.fields.additional.placement, named by their alias, which must be
//     a valid attribute name (a-z, 0-9, at most 20 characters; New refuses
//     others and says which alias to give); an alias that is a core
//     attribute's name (type, id, …) stays a plain header;
//   - traceparent (and tracestate), the Distributed Tracing extension: the
//     writer's trace context the record carries (tracing.span.context.field
//     or the headers column).
//
// Logical-message events (RouteMessage) become CloudEvents under the
// defaults' options: id, type (required), subject from aggregateid, and
// datacontenttype application/json (text/plain for a string payload member).
//
// cloudevents.mode binary (the default) keeps the value as it is and adds
// the attributes as headers named by the protocol binding (CEBinding: Kafka
// ce_, NATS ce-, AMQP cloudEvents:); structured replaces the value with the
// JSON event format (application/cloudevents+json): data inline when the
// payload is JSON or text, data_base64 otherwise. The record's other headers
// (id, placements, the headers column, outboxd.*) stay in both modes.

// CEBinding is how a protocol binding names CloudEvents attributes in binary
// mode.
type CEBinding struct {
	// Prefix goes before every attribute name: "ce_" (Kafka), "ce-"
	// (NATS), "cloudEvents:" (AMQP).
	Prefix string
	// ContentType, when not empty, is the header that carries
	// datacontenttype (Kafka and AMQP: "content-type") instead of
	// Prefix+"datacontenttype", and the structured mode's media type.
	ContentType string
	// PercentEncode: attribute values are percent-encoded as the NATS
	// binding requires (space, '"', '%' and everything outside printable
	// ASCII).
	PercentEncode bool
}

// DataContentTypeKey is the header that carries datacontenttype in binary
// mode: what a value encoder that runs after routing (and replaces the
// value) sets to its own media type.
func (b CEBinding) DataContentTypeKey() string {
	if b.ContentType != "" {
		return b.ContentType
	}
	return b.Prefix + "datacontenttype"
}

// The protocol bindings outboxd's brokers use.
var (
	CEKafka = CEBinding{Prefix: "ce_", ContentType: "content-type"}
	// CENATS: NATS protocol binding 1.0.3 binary mode (NATS ≥ 2.2 headers).
	// Its structured mode's media type goes in Content-Type.
	CENATS = CEBinding{Prefix: "ce-", PercentEncode: true}
	// CEAMQP: the AMQP binding's application properties; the RabbitMQ sink
	// moves the content-type header into the message's content-type
	// property.
	CEAMQP = CEBinding{Prefix: "cloudEvents:", ContentType: "content-type"}
)

// CloudEventsConfig configures the CloudEvents envelope (Config.CloudEvents).
type CloudEventsConfig struct {
	// Envelope is the default of the per-table option envelope: "" or
	// "none", or "cloudevents".
	Envelope string
	// Mode is the default of cloudevents.mode: binary (default) or
	// structured.
	Mode string
	// Source is the default of cloudevents.source; New requires one when
	// any table uses CloudEvents.
	Source string
	// Binding names the attributes in binary mode (default CEKafka).
	Binding CEBinding
}

const (
	optEnvelope = "envelope"
	optCEMode   = "cloudevents.mode"
	optCESource = "cloudevents.source"

	envelopeNone       = "none"
	envelopeCloud      = "cloudevents"
	ceBinary           = "binary"
	ceStructured       = "structured"
	ceStructuredType   = "application/cloudevents+json; charset=UTF-8"
	natsContentTypeKey = "Content-Type"
)

// ceSettings are a table's resolved CloudEvents options.
type ceSettings struct {
	on         bool
	structured bool
	source     string
}

// ceCoreAttrs are the attribute names the spec reserves (and data members of
// the JSON format): a placement aliased so is not an extension.
var ceCoreAttrs = map[string]bool{"id": true, "source": true, "specversion": true, "type": true, "subject": true,
	"time": true, "datacontenttype": true, "dataschema": true, "data": true, "data_base64": true,
	"traceparent": true, "tracestate": true}

// validCEName: CloudEvents attribute names are lower-case ASCII letters and
// digits; the spec asks for at most 20 characters.
func validCEName(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// resolveCE validates the CloudEvents options of eff.
func resolveCE(eff Options, fields []fieldSpec, bad func(key, format string, args ...any)) ceSettings {
	var c ceSettings
	switch v := strings.ToLower(strings.TrimSpace(eff[optEnvelope])); v {
	case "", envelopeNone:
	case envelopeCloud:
		c.on = true
	default:
		bad(optEnvelope, "%q is not one of none, cloudevents", eff[optEnvelope])
	}
	switch v := strings.ToLower(strings.TrimSpace(eff[optCEMode])); v {
	case "", ceBinary:
	case ceStructured:
		c.structured = true
	default:
		bad(optCEMode, "%q is not one of binary, structured", eff[optCEMode])
	}
	c.source = strings.TrimSpace(eff[optCESource])
	if !c.on {
		return c
	}
	if c.source == "" {
		bad(optCESource, "CloudEvents need a source (a URI reference, e.g. /outboxd/orders): set --cloudevents-source or cloudevents.source")
	}
	for _, f := range fields {
		if f.place == placeHeader && !ceCoreAttrs[f.alias] && !validCEName(f.alias) {
			bad(optPlacement, "header alias %q is not a valid CloudEvents attribute name (a-z and 0-9, at most 20 characters): give the column such an alias, e.g. %s:header:%s",
				f.alias, f.col, ceNameSuggestion(f.alias))
		}
	}
	return c
}

func ceNameSuggestion(alias string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(alias) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		}
	}
	s := b.String()
	if len(s) > 20 {
		s = s[:20]
	}
	if s == "" {
		s = "ext"
	}
	return s
}

// ceType returns the column position and OID of the CloudEvents type.
func (p *plan) ceTypeColumn(col func(string) (int, uint32)) (int, uint32) {
	if i, oid := col(p.s.typeCol); i >= 0 {
		return i, oid
	}
	for _, f := range p.s.fields {
		if f.place == placeHeader && f.alias == "type" {
			return col(f.col)
		}
	}
	return -1, 0
}

// ceContentType is datacontenttype for a record of p.
func (p *plan) ceContentType() string {
	switch {
	case p.envelope || p.s.jsonValue || isJSONOID(p.payloadOID):
		return "application/json"
	case p.payloadOID == oidBytea:
		return "application/octet-stream"
	}
	return "text/plain"
}

// ceAttr is one attribute, in the order outboxd writes them.
type ceAttr struct{ name, value string }

// cloudEvent makes rec a CloudEvent (see above). vals is the row's values.
func (r *Router) cloudEvent(rec *Record, p *plan, vals []wal.Value, tx Tx) error {
	id := ceHeader(rec.Headers, "id")
	attrs := make([]ceAttr, 0, 8+len(p.fields))
	attrs = append(attrs, ceAttr{"specversion", "1.0"}, ceAttr{"id", string(id)}, ceAttr{"source", p.s.ce.source})
	t := get(vals, p.ceType)
	if p.ceType < 0 || t.null || len(t.data) == 0 {
		return p.invalid(valueRef{data: id}, "CloudEvents need a type: column "+strconv.Quote(p.s.typeCol)+
			" ("+optEventType+") is missing, NULL or empty")
	}
	tb, _ := appendRaw(nil, p.ceTypeOID, t.data)
	attrs = append(attrs, ceAttr{"type", string(tb)})
	if k := get(vals, p.key); !k.null {
		kb, _ := appendRaw(nil, p.keyOID, k.data)
		attrs = append(attrs, ceAttr{"subject", string(kb)})
	}
	ts := rec.Timestamp
	if ts.IsZero() {
		ts = tx.CommitTime
	}
	attrs = append(attrs, ceAttr{"time", ts.UTC().Format(time.RFC3339Nano)})
	ct := p.ceContentType()
	if rec.Value != nil {
		attrs = append(attrs, ceAttr{"datacontenttype", ct})
	}
	for i := range p.fields {
		f := &p.fields[i]
		if f.place != placeHeader || ceCoreAttrs[f.alias] {
			continue
		}
		if v := get(vals, f.idx); !v.null {
			vb, _ := appendRaw(nil, f.oid, v.data)
			attrs = append(attrs, ceAttr{f.alias, string(vb)})
		}
	}
	for _, k := range [...]string{"traceparent", "tracestate"} {
		if v := ceHeader(rec.Headers, k); v != nil {
			attrs = append(attrs, ceAttr{k, string(v)})
		}
	}
	invalid := func(reason string) error { return p.invalid(valueRef{data: id}, reason) }
	return r.ceFinish(rec, p.s.ce.structured, attrs, ct, invalid)
}

// messageCloudEvent makes a logical message's record a CloudEvent: the
// message's id, type (required) and aggregateid; datacontenttype
// application/json for a JSON payload member, text/plain for a string one.
func (r *Router) messageCloudEvent(rec *Record, f *msgFields) error {
	id := scalarText(nil, f.id)
	invalid := func(reason string) error {
		return &InvalidError{Table: r.msgTable, EventID: idText(id), Reason: reason}
	}
	s := r.defaults
	attrs := []ceAttr{{"specversion", "1.0"}, {"id", string(id)}, {"source", s.ce.source}}
	if k := jsonKind(f.typ); k != 's' && k != 'n' || len(scalarText(nil, f.typ)) == 0 {
		return invalid(`CloudEvents need a type: member "type" is missing, null or empty`)
	}
	attrs = append(attrs, ceAttr{"type", string(scalarText(nil, f.typ))})
	if k := jsonKind(f.aggID); k == 's' || k == 'n' {
		attrs = append(attrs, ceAttr{"subject", string(scalarText(nil, f.aggID))})
	}
	attrs = append(attrs, ceAttr{"time", rec.Timestamp.UTC().Format(time.RFC3339Nano)})
	ct := "application/json"
	if jsonKind(f.payload) == 's' {
		ct = "text/plain"
	}
	if rec.Value != nil {
		attrs = append(attrs, ceAttr{"datacontenttype", ct})
	}
	for _, k := range [...]string{"traceparent", "tracestate"} {
		if v := ceHeader(rec.Headers, k); v != nil {
			attrs = append(attrs, ceAttr{k, string(v)})
		}
	}
	return r.ceFinish(rec, s.ce.structured, attrs, ct, invalid)
}

// ceFinish writes attrs into rec: as headers (binary mode, and a record
// without a value, a tombstone or a NULL payload, which keeps none), or as
// the JSON event format (structured).
func (r *Router) ceFinish(rec *Record, structured bool, attrs []ceAttr, ct string, invalid func(string) error) error {
	if structured && rec.Value != nil {
		return r.ceStructured(rec, attrs, ct, invalid)
	}
	b := r.ceBinding
	hdrs := make([]Header, 0, len(attrs)+len(rec.Headers))
	for _, a := range attrs {
		name := b.Prefix + a.name
		if a.name == "datacontenttype" {
			name = b.DataContentTypeKey()
		}
		v := a.value
		if b.PercentEncode {
			v = percentEncode(v)
		}
		hdrs = append(hdrs, Header{Key: name, Value: []byte(v)})
	}
	rec.Headers = append(hdrs, rec.Headers...)
	return r.ceCheck(rec, invalid)
}

// ceStructured replaces the value with the JSON event format.
func (r *Router) ceStructured(rec *Record, attrs []ceAttr, ct string, invalid func(string) error) error {
	n := 64 + len(rec.Value)*2
	for _, a := range attrs {
		n += len(a.name) + len(a.value)*2 + 6
	}
	buf := make([]byte, 0, n)
	buf = append(buf, '{')
	for i, a := range attrs {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendJacksonString(buf, []byte(a.name))
		buf = append(buf, ':')
		buf = appendJacksonString(buf, []byte(a.value))
	}
	switch {
	case rec.Value == nil: // a tombstone or NULL payload: no data
	case ct == "application/json" && json.Valid(rec.Value):
		buf = append(buf, `,"data":`...)
		buf = append(buf, rec.Value...)
	case ct == "text/plain":
		buf = append(buf, `,"data":`...)
		buf = appendJacksonString(buf, rec.Value)
	default:
		buf = append(buf, `,"data_base64":"`...)
		buf = base64.StdEncoding.AppendEncode(buf, rec.Value)
		buf = append(buf, '"')
	}
	rec.Value = append(buf, '}')
	key := r.ceBinding.ContentType
	if key == "" {
		key = natsContentTypeKey
	}
	rec.Headers = append([]Header{{Key: key, Value: []byte(ceStructuredType)}}, rec.Headers...)
	return r.ceCheck(rec, invalid)
}

// ceCheck applies the record bounds to what the envelope added.
func (r *Router) ceCheck(rec *Record, invalid func(string) error) error {
	if len(rec.Headers) > r.maxHeaders {
		return invalid("the CloudEvent would have " + strconv.Itoa(len(rec.Headers)) + " headers, more than " + strconv.Itoa(r.maxHeaders))
	}
	if size := rec.Size(); r.maxRecord > 0 && size > r.maxRecord {
		return invalid(tooLargeReason(size, r.maxRecord))
	}
	return nil
}

func ceHeader(hdrs []Header, key string) []byte {
	for _, h := range hdrs {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

// percentEncode encodes a NATS header value as the NATS binding requires.
func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '"' || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c > '~' || c == '"' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// ceBase is Config.CloudEvents as the bottom layer of the per-table options.
func ceBase(c CloudEventsConfig, base Options) error {
	var errs []error
	switch v := strings.ToLower(strings.TrimSpace(c.Envelope)); v {
	case "", envelopeNone:
	case envelopeCloud:
		base[optEnvelope] = v
	default:
		errs = append(errs, fmt.Errorf("envelope: %q is not one of none, cloudevents", c.Envelope))
	}
	if c.Mode != "" {
		base[optCEMode] = c.Mode
	}
	if c.Source != "" {
		base[optCESource] = c.Source
	}
	return errors.Join(errs...)
}
