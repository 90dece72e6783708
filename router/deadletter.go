package router

import (
	"encoding/base64"
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/outboxd/outboxd/wal"
)

// Dead-letter header keys.
const (
	HeaderError  = "outboxd.error"
	HeaderSource = "outboxd.source"
)

// DeadLetter builds the record that carries an unroutable row to a
// dead-letter topic (check the topic once with ValidTopic):
//
//   - value: a JSON object of the row's columns in table order, each the
//     text PostgreSQL sent as a JSON string (bytea as its "\x…" hex text),
//     NULL as null;
//   - key: nil;
//   - headers: outboxd.error (cause's text), outboxd.source ("schema.table"),
//     outboxd.commit_lsn, outboxd.xid, and "id" when the table's event id
//     column (table.field.event.id) has a value;
//   - timestamp: the commit time; partition -1.
//
// The record owns its bytes.
func (r *Router) DeadLetter(topic string, row *wal.Row, tx Tx, cause error) Record {
	row, _ = r.textForm(row) // binary pgoutput: binary.go
	p := r.planFor(row.Relation)
	cols := row.Relation.Columns
	var id valueRef
	if p.id >= 0 {
		id = get(row.Values, p.id)
	} else {
		id.null = true
	}
	errText := causeText(cause)

	if len(id.data) > maxIDText {
		id.data = id.data[:maxIDText]
	}
	fixed := len(errText) + len(p.table) + lsnHeadersMax + len(id.data) + len(topic) + 6*(HeaderOverhead+len(HeaderValueOmitted))
	n := 2
	for i, c := range cols {
		n += jacksonStringLen([]byte(c.Name)) + 2 + jsonValueLen(0, get(row.Values, i), false)
	}
	// A dead letter too large to publish keeps its headers only; deciding
	// before building it keeps a huge row from costing its size again.
	omit := row.Oversize > 0 || (r.maxRecord > 0 && n+fixed > r.maxRecord)
	if omit {
		n = 0
	}
	buf := make([]byte, 0, n+fixed)
	rec := Record{Topic: topic, Timestamp: tx.CommitTime, Partition: -1}
	if !omit {
		buf = append(buf, '{')
		for i, c := range cols {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendJacksonString(buf, []byte(c.Name))
			buf = append(buf, ':')
			buf, _ = appendJSONValue(buf, 0, get(row.Values, i), false) // oid 0: always text
		}
		buf = append(buf, '}')
		rec.Value = buf[0:len(buf):len(buf)]
	}
	hdrs := make([]Header, 0, 6)
	buf, hdrs = appendDeadLetterHeaders(buf, hdrs, errText, p.table, tx)
	if omit {
		hdrs = append(hdrs, Header{Key: HeaderValueOmitted, Value: []byte(valueOmittedText)})
	}
	if !id.null {
		start := len(buf)
		buf = append(buf, id.data...)
		hdrs = append(hdrs, Header{Key: "id", Value: buf[start:len(buf):len(buf)]})
	}
	rec.Headers = hdrs
	return rec
}

// DeadLetterMessage builds the dead-letter record of an unroutable logical
// message: the value is the JSON object {"prefix": …, "content": …} with the
// content as a JSON string (or "content_base64" when it is not valid UTF-8);
// headers and the rest are as in DeadLetter, with outboxd.source
// "message:<prefix>" and "id" when the content is an object with an id.
func (r *Router) DeadLetterMessage(topic string, m *wal.Message, tx Tx, cause error) Record {
	errText := causeText(cause)
	source := "message:" + m.Prefix
	id, hasID := messageEventID(m.Content)
	textual := utf8.Valid(m.Content)

	if len(id) > maxIDText {
		id = id[:maxIDText]
	}
	fixed := len(`{"prefix":,"content_base64":}`) + jacksonStringLen([]byte(m.Prefix)) + len(errText) + len(source) + lsnHeadersMax + len(id) +
		len(topic) + 6*(HeaderOverhead+len(HeaderValueOmitted))
	n := 0
	if textual {
		n += jacksonStringLen(m.Content)
	} else {
		n += base64.StdEncoding.EncodedLen(len(m.Content)) + 2
	}
	omit := m.Oversize > 0 || (r.maxRecord > 0 && n+fixed > r.maxRecord)
	if omit {
		n = 0
	}
	buf := make([]byte, 0, n+fixed)
	rec := Record{Topic: topic, Timestamp: tx.CommitTime, Partition: -1}
	if !omit {
		buf = append(buf, `{"prefix":`...)
		buf = appendJacksonString(buf, []byte(m.Prefix))
		if textual {
			buf = append(buf, `,"content":`...)
			buf = appendJacksonString(buf, m.Content)
		} else {
			buf = append(buf, `,"content_base64":"`...)
			buf = base64.StdEncoding.AppendEncode(buf, m.Content)
			buf = append(buf, '"')
		}
		buf = append(buf, '}')
		rec.Value = buf[0:len(buf):len(buf)]
	}
	hdrs := make([]Header, 0, 6)
	buf, hdrs = appendDeadLetterHeaders(buf, hdrs, errText, source, tx)
	if omit {
		hdrs = append(hdrs, Header{Key: HeaderValueOmitted, Value: []byte(valueOmittedText)})
	}
	if hasID {
		start := len(buf)
		buf = append(buf, id...)
		hdrs = append(hdrs, Header{Key: "id", Value: buf[start:len(buf):len(buf)]})
	}
	rec.Headers = hdrs
	return rec
}

// HeaderValueOmitted marks a dead letter whose value was left out because it
// would not fit --max-message-bytes.
const HeaderValueOmitted = "outboxd.value_omitted"

const valueOmittedText = "too large for --max-message-bytes"

// causeText is the cause with its detail (InvalidError.FullText).
func causeText(cause error) string {
	if cause == nil {
		return ""
	}
	var inv *InvalidError
	if errors.As(cause, &inv) && inv == cause {
		return inv.FullText()
	}
	return cause.Error()
}

func appendDeadLetterHeaders(buf []byte, hdrs []Header, errText, source string, tx Tx) ([]byte, []Header) {
	start := len(buf)
	buf = append(buf, errText...)
	hdrs = append(hdrs, Header{Key: HeaderError, Value: buf[start:len(buf):len(buf)]})
	start = len(buf)
	buf = append(buf, source...)
	hdrs = append(hdrs, Header{Key: HeaderSource, Value: buf[start:len(buf):len(buf)]})
	start = len(buf)
	buf = appendLSN(buf, uint64(tx.CommitLSN))
	hdrs = append(hdrs, Header{Key: HeaderCommitLSN, Value: buf[start:len(buf):len(buf)]})
	start = len(buf)
	buf = strconv.AppendUint(buf, uint64(tx.Xid), 10)
	hdrs = append(hdrs, Header{Key: HeaderXid, Value: buf[start:len(buf):len(buf)]})
	return buf, hdrs
}
