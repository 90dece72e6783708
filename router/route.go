package router

import (
	"encoding/base64"
	"math"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/wal"
)

// Header keys outboxd adds with Config.LSNHeaders.
const (
	HeaderCommitLSN  = "outboxd.commit_lsn"
	HeaderXid        = "outboxd.xid"
	HeaderCommitTime = "outboxd.commit_time"
	// lsnHeadersMax bounds the bytes of the three LSN header values.
	lsnHeadersMax = lsnTextMax + 10 + len("-292277026596-12-04T15:30:07.999999999Z")
	lsnHeaderKeys = len(HeaderCommitLSN) + len(HeaderXid) + len(HeaderCommitTime)
)

// plan is a relation's routing, resolved once per *wal.Relation: column
// positions and types, and the problems every row of it would have.
type plan struct {
	rel   *wal.Relation
	s     *settings
	table string

	id, key, payload, route, ts, hdrs int // column positions; -1: none
	spanCtx                           int // tracing.span.context.field's position; -1: none
	ceType                            int // CloudEvents' type column; -1: none
	ceTypeOID                         uint32
	idOID, keyOID, payloadOID, tsOID  uint32

	fields     []fieldPlan // placements present in the relation, in order
	nHeaders   int         // header placements among fields
	aliasBytes int         // the lengths of their names
	envelope   bool        // some field goes to the envelope
	partition  int         // column position of the partition placement, or -1
	noIDReason string      // the id column is missing
	err        string      // a problem every row of the relation has
}

type fieldPlan struct {
	idx      int
	oid      uint32
	place    placement
	alias    string
	jsonName []byte // `,"alias":` for envelope fields
}

// planFor returns rel's plan, building it on first sight. A schema change
// makes the stream announce a new *wal.Relation, hence a new plan; the plans
// of the table's older relations are dropped.
func (r *Router) planFor(rel *wal.Relation) *plan {
	if p := r.last; p != nil && p.rel == rel {
		return p
	}
	p, ok := r.plans[rel]
	if !ok {
		p = r.buildPlan(rel)
		for old := range r.plans {
			if old.ID == rel.ID {
				delete(r.plans, old)
			}
		}
		if len(r.plans) >= maxPlans {
			clear(r.plans)
		}
		r.plans[rel] = p
	}
	r.last = p
	return p
}

func (r *Router) buildPlan(rel *wal.Relation) *plan {
	table := rel.QualifiedName()
	s := r.settingsFor(table)
	p := &plan{rel: rel, s: s, table: table, ts: -1, hdrs: -1, partition: -1, spanCtx: -1}
	col := func(name string) (int, uint32) {
		i := rel.ColumnIndex(name)
		if i < 0 {
			return -1, 0
		}
		return i, rel.Columns[i].TypeOID
	}
	fail := func(reason string) {
		if p.err == "" {
			p.err = reason
		}
	}
	missing := func(name, option string) string {
		return "no column " + strconv.Quote(name) + " (" + option + ")"
	}
	p.id, p.idOID = col(s.idCol)
	if p.id < 0 {
		p.noIDReason = missing(s.idCol, optEventID)
	}
	if p.payload, p.payloadOID = col(s.payloadCol); p.payload < 0 {
		fail(missing(s.payloadCol, optEventPayload))
	}
	if p.route, _ = col(s.routeCol); p.route < 0 {
		fail(missing(s.routeCol, optRouteBy))
	}
	if p.key, p.keyOID = col(s.keyCol); p.key < 0 {
		fail(missing(s.keyCol, optEventKey))
	}
	if s.tsCol != "" {
		if p.ts, p.tsOID = col(s.tsCol); p.ts < 0 {
			fail(missing(s.tsCol, optEventTimestamp))
		} else {
			switch p.tsOID {
			case oidTimestamp, oidTimestamptz, oidInt8, oidInt4:
			default:
				fail("column " + strconv.Quote(s.tsCol) + " (" + optEventTimestamp + ") has type OID " +
					strconv.FormatUint(uint64(p.tsOID), 10) + "; timestamp, timestamptz, int8 or int4 (epoch milliseconds) is required")
			}
		}
	}
	if s.headersCol != "" {
		p.hdrs, _ = col(s.headersCol)
	}
	if s.tracing.col != "" {
		p.spanCtx, _ = col(s.tracing.col) // no such column: no tracing, as in Debezium
	}
	if s.versionCol != "" && s.envelope() {
		// Debezium reads the version (Struct.getInt32) only to version the
		// envelope's schema: a table without envelope placements ignores it.
		if i, oid := col(s.versionCol); i < 0 {
			fail(missing(s.versionCol, optSchemaVersion))
		} else if oid != oidInt4 {
			fail("column " + strconv.Quote(s.versionCol) + " (" + optSchemaVersion + ") has type OID " +
				strconv.FormatUint(uint64(oid), 10) + "; int4 is required (Debezium reads it as INT32)")
		}
	}
	p.ceType = -1
	if s.ce.on {
		p.ceType, p.ceTypeOID = p.ceTypeColumn(col)
	}
	for _, f := range s.fields {
		i, oid := col(f.col)
		if i < 0 {
			if !s.ignoreMissing && !s.implicitFields {
				fail(missing(f.col, optPlacement))
			}
			continue
		}
		fp := fieldPlan{idx: i, oid: oid, place: f.place, alias: f.alias}
		switch f.place {
		case placeHeader:
			p.nHeaders++
			p.aliasBytes += len(f.alias)
		case placeEnvelope:
			p.envelope = true
			fp.jsonName = append(appendJacksonString([]byte{','}, []byte(f.alias)), ':')
		case placePartition:
			if !isIntOID(oid) {
				fail("column " + strconv.Quote(f.col) + " placed as partition has type OID " +
					strconv.FormatUint(uint64(oid), 10) + "; int2, int4 or int8 is required")
			}
			p.partition = i
		}
		p.fields = append(p.fields, fp)
	}
	return p
}

// get returns column i of vals (NULL if i is out of range or the value was
// not sent).
func get(vals []wal.Value, i int) valueRef {
	if i < 0 || i >= len(vals) || vals[i].IsNull() {
		return valueRef{null: true}
	}
	return valueRef{data: vals[i].Data}
}

func (p *plan) invalid(id valueRef, reason string) error { return p.invalidD(id, reason, "") }

// invalidD is invalid with the offending value (quoteValue) as the detail.
func (p *plan) invalidD(id valueRef, reason, detail string) error {
	e := &InvalidError{Table: p.table, Reason: reason, Detail: detail}
	if !id.null {
		e.EventID = idText(id.data)
	}
	return e
}

// Route builds the record for an inserted outbox row. The record owns its
// bytes (one allocation holds them all): nothing aliases the row, whose
// buffer the stream reuses. An event that cannot be routed yields an
// *InvalidError (errors.Is(err, ErrInvalid)).
//
// It runs in four steps, each refusing what it finds invalid before the
// next: where the event goes (identify), what else the row says (read),
// how large the record will be (measure: a record too large is refused
// before it costs its size in memory), and the record itself (build).
func (r *Router) Route(row *wal.Row, tx Tx) (Record, error) {
	return r.route(row, tx, nil, 0)
}

// RouteInto is Route building the record into s's memory rather than
// allocating it, when that memory is large enough; otherwise it allocates
// as Route does and keeps what it allocated in s for the next call if the
// record's bytes and header list take at most keep bytes. Its key, value
// and header values then live in s: the caller must not pass s again until it is done
// with the record (the relay: once the broker acked it, from a sink that
// reads nothing of a record after its ack, sink.Releaser). keep bounds what
// a caller holding one Scratch per event in flight keeps between events.
func (r *Router) RouteInto(row *wal.Row, tx Tx, s *Scratch, keep int) (Record, error) {
	return r.route(row, tx, s, keep)
}

func (r *Router) route(row *wal.Row, tx Tx, into *Scratch, keep int) (Record, error) {
	ev := rowEvent{commitTime: tx.CommitTime, into: into, keep: keep}
	if err := r.identify(row, &ev); err != nil {
		return Record{}, err
	}
	if err := r.read(&ev); err != nil {
		return Record{}, err
	}
	if err := r.measure(&ev); err != nil {
		return Record{}, err
	}
	return r.build(&ev, tx)
}

// rowEvent is an outbox row as Route reads it: its plan, its values, and
// what the steps found in them.
type rowEvent struct {
	p          *plan
	vals       []wal.Value
	commitTime time.Time
	into       *Scratch // RouteInto's; nil: Route allocates the record
	keep       int      // the largest record into keeps the memory of

	id, key, payload valueRef
	topic            string
	ts               time.Time
	partition        int32
	hdrCol           valueRef // the headers column's JSON object
	nHdrCol          int      // its entries
	sc               spanContext
	tombstone        bool
	expanded         []byte // table.expand.json.payload's JSON (expand.go); nil: none

	n        int // bytes of the record's key, value and header values
	nh       int // headers
	keyBytes int // bytes of the header names
}

// identify finds the row's plan, event id and topic: the checks a row
// fails in the order Debezium's router would (the id first, so that every
// later refusal names the event).
func (r *Router) identify(row *wal.Row, ev *rowEvent) error {
	row, bad := r.textForm(row) // binary pgoutput: binary.go
	p := r.planFor(row.Relation)
	ev.p, ev.vals = p, row.Values
	switch {
	case bad != "":
		return p.invalid(get(row.Values, p.id), bad)
	case row.Oversize > 0:
		return p.invalid(get(row.Values, p.id), oversizeReason(row.Oversize))
	case p.id < 0:
		return p.invalid(valueRef{null: true}, p.noIDReason)
	}
	ev.id = get(ev.vals, p.id)
	switch {
	case ev.id.null:
		return p.invalid(ev.id, "event id column "+strconv.Quote(p.s.idCol)+" is NULL")
	case p.err != "":
		return p.invalid(ev.id, p.err)
	}
	route := get(ev.vals, p.route)
	if route.null || len(route.data) == 0 {
		return p.invalid(ev.id, "routing column "+strconv.Quote(p.s.routeCol)+" is NULL or empty")
	}
	if ev.topic = p.s.topic.topic(route.data); ev.topic == "" {
		return p.invalidD(ev.id, invalidTopicReason, topicDetail(p.s.topic, route.data))
	}
	if reason := r.topicRefusal(ev.topic); reason != "" {
		return p.invalidD(ev.id, reason, "topic "+strconv.Quote(ev.topic))
	}
	return nil
}

// read takes the rest of the event from the row: its timestamp,
// partition, headers column, span context, key and payload.
func (r *Router) read(ev *rowEvent) error {
	p := ev.p
	if err := ev.readTimestamp(); err != nil {
		return err
	}
	if err := ev.readPartition(); err != nil {
		return err
	}
	if err := ev.readHeaderColumn(); err != nil {
		return err
	}
	if p.spanCtx >= 0 {
		if v := get(ev.vals, p.spanCtx); !v.null {
			ev.sc = parseSpanContext(v.data)
		}
	}
	if !ev.sc.present && p.s.tracing.all && ev.nHdrCol == 0 {
		// tracing.with.context.field.only false: Debezium traces a row
		// without a context too, a new trace's root (TestTracingParity).
		// A headers column's entries keep their own meaning (a traceparent
		// there is the parent).
		ev.sc.present = true
	}
	ev.payload = get(ev.vals, p.payload)
	ev.tombstone = p.s.tombstone && blankPayload(p.payloadOID, ev.payload)
	ev.key = get(ev.vals, p.key)
	return r.expandPayload(ev)
}

// readTimestamp is table.field.event.timestamp's value, or the commit time.
func (ev *rowEvent) readTimestamp() error {
	p := ev.p
	ev.ts = ev.commitTime
	if p.ts < 0 {
		return nil
	}
	v := get(ev.vals, p.ts)
	if v.null {
		return nil
	}
	var ok bool
	if ev.ts, ok = parseEventTime(p.tsOID, v.data); !ok {
		return p.invalidD(ev.id, "cannot parse the value of "+
			strconv.Quote(p.s.tsCol)+" ("+optEventTimestamp+") as a timestamp", quoteValue(v.data))
	}
	return nil
}

// readPartition is the partition placement's value (-1: none).
func (ev *rowEvent) readPartition() error {
	p := ev.p
	ev.partition = -1
	if p.partition < 0 {
		return nil
	}
	v := get(ev.vals, p.partition)
	if v.null {
		return nil
	}
	n, ok := parseInt(v.data)
	if !ok || n < 0 || n > math.MaxInt32 {
		return p.invalidD(ev.id, "the partition column's value is not a partition number", quoteValue(v.data))
	}
	ev.partition = int32(n)
	return nil
}

// readHeaderColumn checks the headers column's object and counts its
// entries.
func (ev *rowEvent) readHeaderColumn() error {
	p := ev.p
	if p.hdrs < 0 {
		return nil
	}
	if ev.hdrCol = get(ev.vals, p.hdrs); ev.hdrCol.null {
		return nil
	}
	var reason, detail string
	if ev.nHdrCol, reason, detail = scanHeaderObject(ev.hdrCol.data, p.s.hdrGuard); reason != "" {
		return p.invalidD(ev.id, "headers column "+strconv.Quote(p.s.headersCol)+": "+reason, detail)
	}
	return nil
}

// expandPayload parses the payload for table.expand.json.payload
// (expand.go), into the router's reused buffer.
func (r *Router) expandPayload(ev *rowEvent) error {
	p := ev.p
	if !p.s.expand || !p.s.jsonValue || ev.tombstone || ev.payload.null || !expandsOID(p.payloadOID) {
		return nil
	}
	expanded, reason := expandPayload(r.exp[:0], ev.payload.data, p.s.nullAsBytes, p.envelope)
	if reason != "" {
		return p.invalid(ev.id, reason)
	}
	if expanded != nil {
		r.exp = expanded[:0]
	}
	ev.expanded = expanded
	return nil
}

// measure bounds the record's bytes and counts its headers, and refuses a
// record with too many headers or too large to publish.
func (r *Router) measure(ev *rowEvent) error {
	p := ev.p
	n := rawLen(p.idOID, ev.id.data) + ev.keyLen()
	if !ev.tombstone {
		n += ev.valueLen()
	}
	for i := range p.fields {
		if f := &p.fields[i]; f.place == placeHeader {
			n += rawLen(f.oid, get(ev.vals, f.idx).data)
		}
	}
	n += len(ev.hdrCol.data)
	nh := 1 + p.nHeaders + ev.nHdrCol
	keyBytes := len("id") + p.aliasBytes // header names not counted in n
	if scN, scSize := ev.sc.headers(); scN > 0 {
		nh += scN
		n += scSize
		keyBytes += ev.sc.keyBytes()
	}
	if r.lsnHeaders {
		n += lsnHeadersMax
		nh += 3
		keyBytes += lsnHeaderKeys
	}
	ev.n, ev.nh, ev.keyBytes = n, nh, keyBytes
	if nh > r.maxHeaders {
		return p.invalid(ev.id, "the record would have "+strconv.Itoa(nh)+" headers, more than "+strconv.Itoa(r.maxHeaders))
	}
	if size := n + len(ev.topic) + nh*HeaderOverhead + keyBytes; r.maxRecord > 0 && size > r.maxRecord {
		return p.invalid(ev.id, tooLargeReason(size, r.maxRecord))
	}
	return nil
}

// keyLen bounds what appendKey appends.
func (ev *rowEvent) keyLen() int {
	p, key := ev.p, ev.key
	switch {
	case key.null && p.s.jsonKey:
		return len("null")
	case key.null:
		return 0
	case p.s.jsonKey:
		return keyJSONLen(p.keyOID, key.data)
	}
	return rawLen(p.keyOID, key.data)
}

// valueLen bounds what appendValue appends.
func (ev *rowEvent) valueLen() int {
	p, payload := ev.p, ev.payload
	n := 0
	switch {
	case ev.expanded != nil:
		n = len(ev.expanded)
	case p.s.jsonValue:
		n = jacksonValueLen(p.payloadOID, payload)
	case p.envelope:
		n = jsonValueLen(p.payloadOID, payload, false)
	case !payload.null:
		n = rawLen(p.payloadOID, payload.data)
	}
	if p.envelope {
		n += len(`{"payload":}`)
		for i := range p.fields {
			if f := &p.fields[i]; f.place == placeEnvelope {
				n += len(f.jsonName) + jsonValueLen(f.oid, get(ev.vals, f.idx), true)
			}
		}
	}
	return n
}

// build writes the record into one allocation of the size measure found:
// key, value, then the headers in Debezium's order (tracing's, "id", the
// header placements, the headers column's, outboxd's LSN headers).
func (r *Router) build(ev *rowEvent, tx Tx) (Record, error) {
	p := ev.p
	buf, hdrs := ev.into.take(ev.n, ev.nh)
	rec := Record{Topic: ev.topic, Timestamp: ev.ts, Partition: ev.partition}
	var err error
	if buf, rec.Key, err = ev.appendKey(buf); err != nil {
		return Record{}, err
	}
	if !ev.tombstone {
		if buf, rec.Value, err = ev.appendValue(buf); err != nil {
			return Record{}, err
		}
	}
	// Debezium's tracing runs before the router adds "id": its headers
	// come first.
	buf, hdrs = ev.sc.appendHeaders(buf, hdrs)
	if buf, hdrs, err = ev.appendHeaders(buf, hdrs); err != nil {
		return Record{}, err
	}
	colAt := len(hdrs)
	if ev.nHdrCol > 0 {
		buf, hdrs = decodeHeaderObject(ev.hdrCol.data, buf, hdrs, r.internKey)
		if ev.sc.present {
			hdrs = dropTraceHeaders(hdrs, colAt)
		}
	}
	if r.tracing {
		rec.Trace = r.traceFor(&p.s.tracing, &ev.sc, hdrs[colAt:], tx)
	}
	if r.lsnHeaders {
		_, hdrs = appendLSNHeaders(buf, hdrs, tx)
	}
	rec.Headers = hdrs
	if p.s.ce.on {
		if err := r.cloudEvent(&rec, p, ev.vals, tx); err != nil {
			return Record{}, err
		}
	}
	ev.into.give(buf, hdrs, ev.keep) // a failed record leaves the scratch as it was
	return rec, nil
}

// appendKey appends the record's key (nil: none).
func (ev *rowEvent) appendKey(buf []byte) ([]byte, []byte, error) {
	p, key := ev.p, ev.key
	start := len(buf)
	ok := true
	switch {
	case key.null && p.s.jsonKey:
		// JsonConverter writes a NULL key with a schema (the column's) as
		// the JSON literal null, so these events share one partition.
		buf = append(buf, "null"...)
	case key.null:
		return buf, nil, nil
	case p.s.jsonKey:
		buf, ok = appendKeyJSON(buf, p.keyOID, key.data)
	default:
		buf, ok = appendRaw(buf, p.keyOID, key.data)
	}
	if !ok {
		return buf, nil, p.invalid(ev.id, "key column "+strconv.Quote(p.s.keyCol)+" holds malformed bytea text")
	}
	return buf, buf[start:len(buf):len(buf)], nil
}

// appendValue appends the record's value: the payload as it is, as JSON
// (table.expand.json.payload, value.converter JSON), or in the envelope
// with the envelope placements. nil: a NULL payload outside an envelope.
func (ev *rowEvent) appendValue(buf []byte) ([]byte, []byte, error) {
	p, payload := ev.p, ev.payload
	start := len(buf)
	ok := true
	if p.envelope {
		buf = append(buf, `{"payload":`...)
	}
	switch {
	case ev.expanded != nil:
		buf = append(buf, ev.expanded...)
	case p.s.jsonValue:
		buf, ok = appendJacksonValue(buf, p.payloadOID, payload)
	case p.envelope:
		buf, ok = appendJSONValue(buf, p.payloadOID, payload, false)
	case payload.null:
		return buf, nil, nil
	default:
		buf, ok = appendRaw(buf, p.payloadOID, payload.data)
	}
	if !ok {
		return buf, nil, p.invalid(ev.id, "payload column "+strconv.Quote(p.s.payloadCol)+" holds malformed bytea text")
	}
	if p.envelope {
		for i := range p.fields {
			f := &p.fields[i]
			if f.place != placeEnvelope {
				continue
			}
			buf = append(buf, f.jsonName...)
			if buf, ok = appendJSONValue(buf, f.oid, get(ev.vals, f.idx), true); !ok {
				return buf, nil, p.invalid(ev.id, "column "+strconv.Quote(f.alias)+" holds malformed bytea text")
			}
		}
		buf = append(buf, '}')
	}
	return buf, buf[start:len(buf):len(buf)], nil
}

// appendHeaders appends "id" and the header placements.
func (ev *rowEvent) appendHeaders(buf []byte, hdrs []Header) ([]byte, []Header, error) {
	p := ev.p
	start := len(buf)
	var ok bool
	if buf, ok = appendRaw(buf, p.idOID, ev.id.data); !ok {
		return buf, hdrs, p.invalid(ev.id, "event id column holds malformed bytea text")
	}
	hdrs = append(hdrs, Header{Key: "id", Value: buf[start:len(buf):len(buf)]})
	for i := range p.fields {
		f := &p.fields[i]
		if f.place != placeHeader {
			continue
		}
		v := get(ev.vals, f.idx)
		if v.null {
			hdrs = append(hdrs, Header{Key: f.alias})
			continue
		}
		start = len(buf)
		if buf, ok = appendRaw(buf, f.oid, v.data); !ok {
			return buf, hdrs, p.invalid(ev.id, "column "+strconv.Quote(f.alias)+" holds malformed bytea text")
		}
		hdrs = append(hdrs, Header{Key: f.alias, Value: buf[start:len(buf):len(buf)]})
	}
	return buf, hdrs, nil
}

// invalidTopicReason is the reason of a routing value that gives no valid
// topic; topicDetail says what it gave.
const invalidTopicReason = "the routing value does not give a valid Kafka topic name: 1-249 characters of [a-zA-Z0-9._-], not \".\" or \"..\""

func topicDetail(t *topicRule, value []byte) string {
	got := "routing value " + quoteValue(value)
	var buf []byte
	if m := t.re.FindSubmatchIndex(value); m != nil {
		for _, p := range t.parts {
			if p.group < 0 {
				buf = append(buf, p.lit...)
			} else if m[2*p.group] >= 0 {
				buf = append(buf, value[m[2*p.group]:m[2*p.group+1]]...)
			}
		}
		got += " gives " + quoteValue(buf)
	} else {
		got += ": route.topic.regex does not match it, so the topic would be the raw value"
	}
	return got
}

func appendLSNHeaders(buf []byte, hdrs []Header, tx Tx) ([]byte, []Header) {
	start := len(buf)
	buf = appendLSN(buf, uint64(tx.CommitLSN))
	hdrs = append(hdrs, Header{Key: HeaderCommitLSN, Value: buf[start:len(buf):len(buf)]})
	start = len(buf)
	buf = strconv.AppendUint(buf, uint64(tx.Xid), 10)
	hdrs = append(hdrs, Header{Key: HeaderXid, Value: buf[start:len(buf):len(buf)]})
	start = len(buf)
	buf = tx.CommitTime.UTC().AppendFormat(buf, time.RFC3339Nano)
	hdrs = append(hdrs, Header{Key: HeaderCommitTime, Value: buf[start:len(buf):len(buf)]})
	return buf, hdrs
}

// blankPayload is Debezium's tombstone test: NULL, or a value whose Java
// String.trim() is empty (only bytes <= 0x20). A bytea payload is blank when
// NULL or empty.
func blankPayload(oid uint32, v valueRef) bool {
	if v.null {
		return true
	}
	if oid == oidBytea {
		// Debezium tests payload.toString().trim().isEmpty(): a bytea is a
		// ByteBuffer whose toString is never empty, so only NULL is a
		// tombstone; an empty bytea is an empty value.
		return false
	}
	for _, c := range v.data {
		if c > ' ' {
			return false
		}
	}
	return true
}

// parseEventTime reads table.field.event.timestamp: timestamp (as UTC),
// timestamptz, or an integer of epoch milliseconds.
func parseEventTime(oid uint32, data []byte) (time.Time, bool) {
	switch oid {
	case oidTimestamp, oidTimestamptz:
		return parseTimestamp(data)
	case oidInt8, oidInt4:
		ms, ok := parseInt(data)
		if !ok {
			return time.Time{}, false
		}
		return time.UnixMilli(ms).UTC(), true
	}
	return time.Time{}, false
}

// keyJSONLen bounds what appendKeyJSON appends.
func keyJSONLen(oid uint32, data []byte) int {
	switch {
	case isIntOID(oid):
		return len(data)
	case oid == oidBytea:
		return base64.StdEncoding.EncodedLen(rawLen(oid, data)) + 2
	}
	return jacksonStringLen(data)
}

// appendKeyJSON writes the key as Kafka's JsonConverter (schemas.enable=false)
// writes Debezium's key: int2/int4/int8 as a bare number, bytea as a base64
// string, everything else (text, varchar, uuid, …) as a JSON string.
func appendKeyJSON(dst []byte, oid uint32, data []byte) ([]byte, bool) {
	switch {
	case isIntOID(oid) && isJSONNumber(data):
		return append(dst, data...), true
	case oid == oidBytea:
		return appendJSONValue(dst, oid, valueRef{data: data}, false)
	}
	return appendJacksonString(dst, data), true
}

// internKey returns header key bytes as a string, reusing the string of a
// key seen before (traceparent, tracestate, …) so decoding allocates nothing.
func (r *Router) internKey(b []byte) string {
	if s, ok := r.keys[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(r.keys) < maxHeaderKeys {
		r.keys[s] = s
	}
	return s
}
