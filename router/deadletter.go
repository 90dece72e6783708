package router

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"
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
//     NULL as null; when that would not fit --max-message-bytes, the
//     largest columns are replaced by {"outboxd_omitted_bytes": N,
//     "sha256": "<hex>"} until it does (no value at all when even that
//     does not fit, or the stream read only part of the row), and the
//     outboxd.value_omitted header says what is left out and why;
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
	sizes := make([]int, len(cols))
	n := 2
	for i, c := range cols {
		sizes[i] = jsonValueLen(0, get(row.Values, i), false)
		n += jacksonStringLen([]byte(c.Name)) + 2 + sizes[i]
	}
	// A dead letter too large to publish keeps what fits: the largest
	// columns give way to their length and sha256 until the rest fits, and
	// outboxd.value_omitted says which. A row the stream read only in part
	// has no value to keep. Deciding before building it keeps a huge row
	// from costing its size again.
	var omitted []int // columns replaced by their length and sha256
	note := ""        // outboxd.value_omitted: what is left out, and why
	whole := row.Oversize > 0
	if whole {
		note = "the whole value: the row was " + strconv.Itoa(row.Oversize) + " bytes in the WAL, over 2 × --max-message-bytes, and was read only in part"
	} else if r.maxRecord > 0 && n+fixed > r.maxRecord {
		all := n
		omitted, n, note = r.fitColumns(cols, row.Values, sizes, n, fixed)
		whole = omitted == nil
		if whole {
			note = "the whole value: the row's columns take " + strconv.Itoa(all) + " bytes as JSON, over --max-message-bytes"
		}
	}
	if whole {
		n = 0
	}
	buf := make([]byte, 0, n+fixed+len(note))
	rec := Record{Topic: topic, Timestamp: tx.CommitTime, Partition: -1}
	if !whole {
		buf = append(buf, '{')
		for i, c := range cols {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendJacksonString(buf, []byte(c.Name))
			buf = append(buf, ':')
			if slices.Contains(omitted, i) {
				buf = appendOmitted(buf, get(row.Values, i).data)
				continue
			}
			buf, _ = appendJSONValue(buf, 0, get(row.Values, i), false) // oid 0: always text
		}
		buf = append(buf, '}')
		rec.Value = buf[0:len(buf):len(buf)]
	}
	hdrs := make([]Header, 0, 6)
	buf, hdrs = appendDeadLetterHeaders(buf, hdrs, errText, p.table, tx)
	if note != "" {
		start := len(buf)
		buf = append(buf, note...)
		hdrs = append(hdrs, Header{Key: HeaderValueOmitted, Value: buf[start:len(buf):len(buf)]})
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
	omit, note := false, ""
	switch {
	case m.Oversize > 0:
		omit, note = true, "the whole value: the message was "+strconv.Itoa(m.Oversize)+" bytes in the WAL, over 2 × --max-message-bytes, and was read only in part"
	case r.maxRecord > 0 && n+fixed > r.maxRecord:
		omit, note = true, "the whole value: the message's content takes "+strconv.Itoa(n)+" bytes as JSON, over --max-message-bytes"
	}
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
		hdrs = append(hdrs, Header{Key: HeaderValueOmitted, Value: []byte(note)})
	}
	if hasID {
		start := len(buf)
		buf = append(buf, id...)
		hdrs = append(hdrs, Header{Key: "id", Value: buf[start:len(buf):len(buf)]})
	}
	rec.Headers = hdrs
	return rec
}

// HeaderValueOmitted marks a dead letter that does not carry all of the
// row: its text says what was left out (the whole value, or the columns
// replaced by {"outboxd_omitted_bytes": N, "sha256": "<hex>"}) and why.
const HeaderValueOmitted = "outboxd.value_omitted"

// omittedLen is the length of appendOmitted's object for a value of n bytes.
func omittedLen(n int) int {
	return len(`{"outboxd_omitted_bytes":,"sha256":""}`) + len(strconv.Itoa(n)) + 2*sha256.Size
}

// appendOmitted writes what stands in for a column too large to keep: its
// length and sha256, as PostgreSQL sent its text, so a consumer can tell
// which row it was and check a copy against it.
func appendOmitted(dst, data []byte) []byte {
	sum := sha256.Sum256(data)
	dst = append(dst, `{"outboxd_omitted_bytes":`...)
	dst = strconv.AppendInt(dst, int64(len(data)), 10)
	dst = append(dst, `,"sha256":"`...)
	dst = hex.AppendEncode(dst, sum[:])
	return append(dst, `"}`...)
}

// fitColumns picks the columns to replace by their length and sha256,
// largest first, until the dead letter fits --max-message-bytes: it returns
// them, the value's new length and the outboxd.value_omitted text, or nil
// when even that does not fit.
func (r *Router) fitColumns(cols []wal.Column, vals []wal.Value, sizes []int, n, fixed int) ([]int, int, string) {
	all := n
	order := make([]int, len(sizes))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return sizes[order[a]] > sizes[order[b]] })
	var omitted []int
	var names []string
	for _, i := range order {
		v := get(vals, i)
		if v.null {
			break // every column left is NULL: nothing more to save
		}
		omitted = append(omitted, i)
		names = append(names, cols[i].Name)
		n += omittedLen(len(v.data)) - sizes[i]
		note := "columns " + strings.Join(names, ", ") + " replaced by their length and sha256: the row's columns take " +
			strconv.Itoa(all) + " bytes as JSON, over --max-message-bytes"
		if n+fixed+len(note) <= r.maxRecord {
			return omitted, n, note
		}
	}
	return nil, all, ""
}

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
