package router

import (
	"encoding/json"
	"strconv"

	"github.com/outboxd/outboxd/wal"
)

// RouteMessage routes a table-less outbox event written with
// pg_logical_emit_message(true, prefix, content). ok is false, and the
// message is not an outbox event, unless Config.MessagePrefix is set, the
// message is transactional and its prefix is exactly MessagePrefix
// (non-transactional messages are not part of a transaction the slot can
// confirm, so they are never routed).
//
// The content is a JSON object:
//
//	{"id": "...", "aggregatetype": "...", "aggregateid": "...", "type": "...",
//	 "payload": <any JSON, or a string>, "headers": {"k": "v"}}
//
// Member names are matched exactly. id and aggregatetype are required (a
// string or a number); aggregateid is the key (absent or null: no key);
// payload is the value: a JSON string's contents, any other JSON value's
// bytes verbatim, absent or null giving a null value; headers, an object of
// strings, become headers after "id" (and "type").
//
// Only Config.Defaults apply, and of them only the options that are not
// column names: the topic regex and replacement, the tombstone rule, and the
// "type" header when the default placement puts a "type" column in a header
// (outboxd's default does; its alias is used). Config.KeyFormat and
// Config.LSNHeaders apply as for rows. The timestamp is the commit time.
// Invalid events give an *InvalidError whose Table is "message:<prefix>".
func (r *Router) RouteMessage(m *wal.Message, tx Tx) (rec Record, ok bool, err error) {
	if r.msgPrefix == "" || !m.Transactional || m.Prefix != r.msgPrefix {
		return Record{}, false, nil
	}
	if m.Oversize > 0 {
		return Record{}, true, &InvalidError{Table: r.msgTable, Reason: oversizeReason(m.Oversize)}
	}
	rec, err = r.routeMessage(m.Content, tx)
	return rec, true, err
}

// msgFields are the spans of the top-level members of a message event.
type msgFields struct {
	id, aggType, aggID, typ, payload, headers []byte // raw JSON values; nil: absent
}

func parseMessage(content []byte) (msgFields, string) {
	var f msgFields
	if !json.Valid(content) {
		return f, "content is not valid JSON"
	}
	i := skipSpace(content, 0)
	if content[i] != '{' {
		return f, "content is not a JSON object"
	}
	i = skipSpace(content, i+1)
	var scratch [32]byte
	for i < len(content) && content[i] == '"' {
		end := scanString(content, i)
		name := content[i+1 : end-1]
		for _, c := range name {
			if c == '\\' {
				name = appendUnquoted(scratch[:0], name)
				break
			}
		}
		i = skipSpace(content, end)
		i = skipSpace(content, i+1) // ':'
		vend := skipValue(content, i)
		v := content[i:vend]
		switch string(name) {
		case "id":
			f.id = v
		case "aggregatetype":
			f.aggType = v
		case "aggregateid":
			f.aggID = v
		case "type":
			f.typ = v
		case "payload":
			f.payload = v
		case "headers":
			f.headers = v
		}
		i = skipSpace(content, vend)
		if content[i] == '}' {
			break
		}
		i = skipSpace(content, i+1) // ','
	}
	return f, ""
}

// jsonKind classifies a raw JSON value by its first byte.
func jsonKind(v []byte) byte {
	if len(v) == 0 {
		return 0
	}
	switch c := v[0]; {
	case c == '"':
		return 's'
	case c == 'n':
		return 'z' // null
	case c == '-' || isDigit(c):
		return 'n'
	default:
		return c // '{', '[', 't', 'f'
	}
}

// scalarText is a string member's contents or a number's text.
func scalarText(dst, v []byte) []byte {
	if jsonKind(v) == 's' {
		return appendUnquoted(dst, v[1:len(v)-1])
	}
	return append(dst, v...)
}

// routeMessage routes a message event's content in RouteMessage's steps:
// its members (messageFields), its topic, its size (refused before the
// record's one allocation), then the record.
func (r *Router) routeMessage(content []byte, tx Tx) (Record, error) {
	var ev msgEvent
	var err error
	if ev.f, ev.nHdr, err = r.messageFields(content); err != nil {
		return Record{}, err
	}
	if ev.topic, err = r.messageTopic(&ev.f); err != nil {
		return Record{}, err
	}
	ev.typeAlias, ev.typeHeader = r.defaults.typeHeader()
	ev.typeHeader = ev.typeHeader && ev.f.typ != nil
	if err := r.measureMessage(&ev, content); err != nil {
		return Record{}, err
	}
	return r.buildMessage(&ev, tx)
}

// msgEvent is a message event as routeMessage reads it.
type msgEvent struct {
	f          msgFields
	nHdr       int // entries of the headers member
	topic      string
	typeAlias  string // the header the "type" member fills,
	typeHeader bool   // if the default placement has one and the event a type
	n, nh      int    // the record's bytes and headers
}

// measureMessage bounds the record's bytes and counts its headers, and
// refuses a record with too many headers or too large to publish.
func (r *Router) measureMessage(ev *msgEvent, content []byte) error {
	ev.n = len(content) + 6*len(ev.f.aggID) + 2
	ev.nh = 1 + ev.nHdr
	// What the record holds is taken from the content, but for the names
	// and values outboxd adds.
	size := len(content) + len(ev.topic) + len("id")
	if ev.typeHeader {
		ev.nh++
		size += len(ev.typeAlias)
	}
	if r.lsnHeaders {
		ev.n += lsnHeadersMax
		ev.nh += 3
		size += lsnHeadersMax + lsnHeaderKeys
	}
	if ev.nh > r.maxHeaders {
		return r.msgInvalid(ev.f.id, "the record would have "+strconv.Itoa(ev.nh)+" headers, more than "+strconv.Itoa(r.maxHeaders), "")
	}
	// A header costs HeaderOverhead besides.
	if size += ev.nh * HeaderOverhead; r.maxRecord > 0 && size > r.maxRecord {
		return r.msgInvalid(ev.f.id, tooLargeReason(size, r.maxRecord), "")
	}
	return nil
}

// buildMessage writes the record into one allocation of the size
// measureMessage found: key, value, then the headers ("id", "type", the
// headers member's, outboxd's LSN headers).
func (r *Router) buildMessage(ev *msgEvent, tx Tx) (Record, error) {
	f := &ev.f
	buf := make([]byte, 0, ev.n)
	hdrs := make([]Header, 0, ev.nh)
	rec := Record{Topic: ev.topic, Timestamp: tx.CommitTime, Partition: -1}
	buf, rec.Key = r.appendMessageKey(buf, f.aggID)
	var payload []byte
	buf, payload = appendMessagePayload(buf, f.payload)
	if !(r.defaults.tombstone && blankPayload(0, valueRef{data: payload, null: payload == nil})) {
		rec.Value = payload
	}
	start := len(buf)
	buf = scalarText(buf, f.id)
	hdrs = append(hdrs, Header{Key: "id", Value: buf[start:len(buf):len(buf)]})
	if ev.typeHeader {
		if jsonKind(f.typ) == 'z' {
			hdrs = append(hdrs, Header{Key: ev.typeAlias})
		} else {
			start = len(buf)
			buf = scalarText(buf, f.typ)
			hdrs = append(hdrs, Header{Key: ev.typeAlias, Value: buf[start:len(buf):len(buf)]})
		}
	}
	colAt := len(hdrs)
	if ev.nHdr > 0 {
		buf, hdrs = decodeHeaderObject(f.headers, buf, hdrs, r.internKey)
	}
	if r.tracing { // a message has no span context column: its headers' traceparent, if any
		rec.Trace = r.traceFor(&r.defaults.tracing, &spanContext{}, hdrs[colAt:], tx)
	}
	if r.lsnHeaders {
		_, hdrs = appendLSNHeaders(buf, hdrs, tx)
	}
	rec.Headers = hdrs
	if r.defaults.ce.on {
		if err := r.messageCloudEvent(&rec, f); err != nil {
			return Record{}, err
		}
	}
	return rec, nil
}

// msgInvalid is a message event's *InvalidError; id is its "id" member
// (nil: not known yet).
func (r *Router) msgInvalid(id []byte, reason, detail string) error {
	e := &InvalidError{Table: r.msgTable, Reason: reason, Detail: detail}
	if id != nil {
		e.EventID = idText(scalarText(nil, id))
	}
	return e
}

// messageMembers are the members of a message event RouteMessage reads as
// scalars: each must be a string or a number, or, unless required, absent
// or null. "id" comes first: the refusals after it name the event.
var messageMembers = [...]struct {
	name     string
	required bool
}{{"id", true}, {"aggregatetype", true}, {"aggregateid", false}, {"type", false}}

// messageFields parses a message event's content and checks its members
// (messageMembers, and the headers object, whose entries it counts).
func (r *Router) messageFields(content []byte) (msgFields, int, error) {
	f, reason := parseMessage(content)
	if reason != "" {
		return f, 0, r.msgInvalid(nil, reason, "")
	}
	var id []byte // the event's id, once checked
	for i, v := range [len(messageMembers)][]byte{f.id, f.aggType, f.aggID, f.typ} {
		m := messageMembers[i]
		switch jsonKind(v) {
		case 's', 'n':
		case 0, 'z':
			if m.required {
				return f, 0, r.msgInvalid(id, `member "`+m.name+`" is missing or null`, "")
			}
		default:
			return f, 0, r.msgInvalid(id, `member "`+m.name+`" is not a string or a number`, "")
		}
		id = f.id
	}
	if f.headers == nil {
		return f, 0, nil
	}
	nHdr, reason, detail := scanHeaderObject(f.headers, r.defaults.hdrGuard)
	if reason != "" {
		return f, 0, r.msgInvalid(f.id, `member "headers": `+reason, detail)
	}
	return f, nHdr, nil
}

// messageTopic is the topic of a message event's aggregatetype, by the
// default topic rule.
func (r *Router) messageTopic(f *msgFields) (string, error) {
	s := r.defaults
	route := f.aggType // a number's text
	if jsonKind(route) == 's' {
		route = route[1 : len(route)-1]
		for _, c := range route {
			if c == '\\' {
				route = appendUnquoted(nil, route) // rare: escapes in the type
				break
			}
		}
	}
	if len(route) == 0 {
		return "", r.msgInvalid(f.id, `member "aggregatetype" is empty`, "")
	}
	topic := s.topic.topic(route)
	if topic == "" {
		return "", r.msgInvalid(f.id, invalidTopicReason, topicDetail(s.topic, route))
	}
	if reason := r.topicRefusal(topic); reason != "" {
		return "", r.msgInvalid(f.id, reason, "topic "+strconv.Quote(topic))
	}
	return topic, nil
}

// typeHeader is the alias of the header the default placement puts a
// "type" column in (ok false: none), which a message's "type" fills.
func (s *settings) typeHeader() (alias string, ok bool) {
	for _, fs := range s.fields {
		if fs.col == "type" && fs.place == placeHeader {
			return fs.alias, true
		}
	}
	return "", false
}

// appendMessageKey appends the key of a message's aggregateid (nil: absent
// or null), as --key-format asks.
func (r *Router) appendMessageKey(buf, aggID []byte) ([]byte, []byte) {
	k := jsonKind(aggID)
	if k != 's' && k != 'n' {
		return buf, nil
	}
	start := len(buf)
	switch {
	case r.defaults.jsonKey && k == 'n':
		buf = append(buf, aggID...)
	case r.defaults.jsonKey:
		buf = appendUnquoted(buf, aggID[1:len(aggID)-1])
		plain := len(buf)
		buf = appendJacksonString(buf, buf[start:plain])
		buf = append(buf[:start], buf[plain:]...)
	default:
		buf = scalarText(buf, aggID)
	}
	return buf, buf[start:len(buf):len(buf)]
}

// appendMessagePayload appends a message's payload: a JSON string's
// contents, any other JSON value's bytes (nil: absent or null).
func appendMessagePayload(buf, v []byte) ([]byte, []byte) {
	start := len(buf)
	switch jsonKind(v) {
	case 0, 'z':
		return buf, nil
	case 's':
		buf = appendUnquoted(buf, v[1:len(v)-1])
	default:
		buf = append(buf, v...)
	}
	return buf, buf[start:len(buf):len(buf)]
}

// messageEventID extracts the "id" of a message event for dead letters.
func messageEventID(content []byte) (string, bool) {
	f, reason := parseMessage(content)
	if reason != "" {
		return "", false
	}
	switch jsonKind(f.id) {
	case 's', 'n':
		return string(scalarText(nil, f.id)), true
	}
	return "", false
}
