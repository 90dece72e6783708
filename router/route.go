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
func (r *Router) Route(row *wal.Row, tx Tx) (Record, error) {
	row, bad := r.textForm(row) // binary pgoutput: binary.go
	p := r.planFor(row.Relation)
	if bad != "" {
		return Record{}, p.invalid(get(row.Values, p.id), bad)
	}
	vals := row.Values
	if row.Oversize > 0 {
		return Record{}, p.invalid(get(vals, p.id), oversizeReason(row.Oversize))
	}
	if p.id < 0 {
		return Record{}, p.invalid(valueRef{null: true}, p.noIDReason)
	}
	id := get(vals, p.id)
	if id.null {
		return Record{}, p.invalid(id, "event id column "+strconv.Quote(p.s.idCol)+" is NULL")
	}
	if p.err != "" {
		return Record{}, p.invalid(id, p.err)
	}
	route := get(vals, p.route)
	if route.null || len(route.data) == 0 {
		return Record{}, p.invalid(id, "routing column "+strconv.Quote(p.s.routeCol)+" is NULL or empty")
	}
	topic := p.s.topic.topic(route.data)
	if topic == "" {
		return Record{}, p.invalidD(id, invalidTopicReason, topicDetail(p.s.topic, route.data))
	}
	if reason := r.topicRefusal(topic); reason != "" {
		return Record{}, p.invalidD(id, reason, "topic "+strconv.Quote(topic))
	}

	// Validate and size everything before the one allocation.
	ts := tx.CommitTime
	if p.ts >= 0 {
		if v := get(vals, p.ts); !v.null {
			var ok bool
			if ts, ok = parseEventTime(p.tsOID, v.data); !ok {
				return Record{}, p.invalidD(id, "cannot parse the value of "+
					strconv.Quote(p.s.tsCol)+" ("+optEventTimestamp+") as a timestamp", quoteValue(v.data))
			}
		}
	}
	partition := int32(-1)
	if p.partition >= 0 {
		if v := get(vals, p.partition); !v.null {
			n, ok := parseInt(v.data)
			if !ok || n < 0 || n > math.MaxInt32 {
				return Record{}, p.invalidD(id, "the partition column's value is not a partition number", quoteValue(v.data))
			}
			partition = int32(n)
		}
	}
	var hdrCol valueRef
	nHdrCol := 0
	if p.hdrs >= 0 {
		if hdrCol = get(vals, p.hdrs); !hdrCol.null {
			var reason string
			var detail string
			if nHdrCol, reason, detail = scanHeaderObject(hdrCol.data, p.s.hdrGuard); reason != "" {
				return Record{}, p.invalidD(id, "headers column "+strconv.Quote(p.s.headersCol)+": "+reason, detail)
			}
		}
	}
	var sc spanContext
	if p.spanCtx >= 0 {
		if v := get(vals, p.spanCtx); !v.null {
			sc = parseSpanContext(v.data)
		}
	}
	if !sc.present && p.s.tracing.all && nHdrCol == 0 {
		// tracing.with.context.field.only false: Debezium traces a row
		// without a context too, a new trace's root (TestTracingParity).
		// A headers column's entries keep their own meaning (a traceparent
		// there is the parent).
		sc.present = true
	}
	payload := get(vals, p.payload)
	tombstone := p.s.tombstone && blankPayload(p.payloadOID, payload)
	key := get(vals, p.key)
	var expanded []byte // table.expand.json.payload's JSON (expand.go); nil: none
	if p.s.expand && p.s.jsonValue && !tombstone && !payload.null && expandsOID(p.payloadOID) {
		var reason string
		if expanded, reason = expandPayload(r.exp[:0], payload.data, p.s.nullAsBytes, p.envelope); reason != "" {
			return Record{}, p.invalid(id, reason)
		}
		if expanded != nil {
			r.exp = expanded[:0]
		}
	}

	n := rawLen(p.idOID, id.data)
	if key.null && p.s.jsonKey {
		n += len("null")
	}
	if !key.null {
		if p.s.jsonKey {
			n += keyJSONLen(p.keyOID, key.data)
		} else {
			n += rawLen(p.keyOID, key.data)
		}
	}
	if !tombstone {
		switch {
		case expanded != nil:
			n += len(expanded)
		case p.s.jsonValue:
			n += jacksonValueLen(p.payloadOID, payload)
		case p.envelope:
			n += jsonValueLen(p.payloadOID, payload, false)
		case !payload.null:
			n += rawLen(p.payloadOID, payload.data)
		}
		if p.envelope {
			n += len(`{"payload":}`)
			for i := range p.fields {
				if f := &p.fields[i]; f.place == placeEnvelope {
					n += len(f.jsonName) + jsonValueLen(f.oid, get(vals, f.idx), true)
				}
			}
		}
	}
	for i := range p.fields {
		if f := &p.fields[i]; f.place == placeHeader {
			n += rawLen(f.oid, get(vals, f.idx).data)
		}
	}
	n += len(hdrCol.data)
	nh := 1 + p.nHeaders + nHdrCol
	keyBytes := len("id") + p.aliasBytes // header names not counted in n
	if scN, scSize := sc.headers(); scN > 0 {
		nh += scN
		n += scSize
		keyBytes += sc.keyBytes()
	}
	if r.lsnHeaders {
		n += lsnHeadersMax
		nh += 3
		keyBytes += lsnHeaderKeys
	}
	if nh > r.maxHeaders {
		return Record{}, p.invalid(id, "the record would have "+strconv.Itoa(nh)+" headers, more than "+strconv.Itoa(r.maxHeaders))
	}
	// The size check comes before the allocation: an event too large to
	// publish must not cost its size in memory once more.
	if size := n + len(topic) + nh*HeaderOverhead + keyBytes; r.maxRecord > 0 && size > r.maxRecord {
		return Record{}, p.invalid(id, tooLargeReason(size, r.maxRecord))
	}

	buf := make([]byte, 0, n)
	hdrs := make([]Header, 0, nh)
	rec := Record{Topic: topic, Timestamp: ts, Partition: partition}
	var ok bool
	start := 0
	if key.null && p.s.jsonKey {
		// JsonConverter writes a NULL key with a schema (the column's) as
		// the JSON literal null, so these events share one partition.
		buf = append(buf, "null"...)
		rec.Key = buf[start:len(buf):len(buf)]
	}
	if !key.null {
		if p.s.jsonKey {
			buf, ok = appendKeyJSON(buf, p.keyOID, key.data)
		} else {
			buf, ok = appendRaw(buf, p.keyOID, key.data)
		}
		if !ok {
			return Record{}, p.invalid(id, "key column "+strconv.Quote(p.s.keyCol)+" holds malformed bytea text")
		}
		rec.Key = buf[start:len(buf):len(buf)]
	}
	if !tombstone {
		start = len(buf)
		switch {
		case expanded != nil && !p.envelope:
			buf = append(buf, expanded...)
			rec.Value = buf[start:len(buf):len(buf)]
		case p.s.jsonValue && !p.envelope:
			if buf, ok = appendJacksonValue(buf, p.payloadOID, payload); !ok {
				return Record{}, p.invalid(id, "payload column "+strconv.Quote(p.s.payloadCol)+" holds malformed bytea text")
			}
			rec.Value = buf[start:len(buf):len(buf)]
		case p.envelope:
			buf = append(buf, `{"payload":`...)
			ok = true
			switch {
			case expanded != nil:
				buf = append(buf, expanded...)
			case p.s.jsonValue:
				buf, ok = appendJacksonValue(buf, p.payloadOID, payload)
			default:
				buf, ok = appendJSONValue(buf, p.payloadOID, payload, false)
			}
			if !ok {
				return Record{}, p.invalid(id, "payload column "+strconv.Quote(p.s.payloadCol)+" holds malformed bytea text")
			}
			for i := range p.fields {
				f := &p.fields[i]
				if f.place != placeEnvelope {
					continue
				}
				buf = append(buf, f.jsonName...)
				if buf, ok = appendJSONValue(buf, f.oid, get(vals, f.idx), true); !ok {
					return Record{}, p.invalid(id, "column "+strconv.Quote(f.alias)+" holds malformed bytea text")
				}
			}
			buf = append(buf, '}')
			rec.Value = buf[start:len(buf):len(buf)]
		case !payload.null:
			if buf, ok = appendRaw(buf, p.payloadOID, payload.data); !ok {
				return Record{}, p.invalid(id, "payload column "+strconv.Quote(p.s.payloadCol)+" holds malformed bytea text")
			}
			rec.Value = buf[start:len(buf):len(buf)]
		}
	}
	// Debezium's tracing runs before the router adds "id": its headers
	// come first.
	buf, hdrs = sc.appendHeaders(buf, hdrs)
	start = len(buf)
	if buf, ok = appendRaw(buf, p.idOID, id.data); !ok {
		return Record{}, p.invalid(id, "event id column holds malformed bytea text")
	}
	hdrs = append(hdrs, Header{Key: "id", Value: buf[start:len(buf):len(buf)]})
	for i := range p.fields {
		f := &p.fields[i]
		if f.place != placeHeader {
			continue
		}
		v := get(vals, f.idx)
		if v.null {
			hdrs = append(hdrs, Header{Key: f.alias})
			continue
		}
		start = len(buf)
		if buf, ok = appendRaw(buf, f.oid, v.data); !ok {
			return Record{}, p.invalid(id, "column "+strconv.Quote(f.alias)+" holds malformed bytea text")
		}
		hdrs = append(hdrs, Header{Key: f.alias, Value: buf[start:len(buf):len(buf)]})
	}
	colAt := len(hdrs)
	if nHdrCol > 0 {
		buf, hdrs = decodeHeaderObject(hdrCol.data, buf, hdrs, r.internKey)
		if sc.present {
			hdrs = dropTraceHeaders(hdrs, colAt)
		}
	}
	if r.tracing {
		rec.Trace = r.traceFor(&p.s.tracing, &sc, hdrs[colAt:], tx)
	}
	if r.lsnHeaders {
		_, hdrs = appendLSNHeaders(buf, hdrs, tx)
	}
	rec.Headers = hdrs
	if p.s.ce.on {
		if err := r.cloudEvent(&rec, p, vals, tx); err != nil {
			return Record{}, err
		}
	}
	return rec, nil
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
