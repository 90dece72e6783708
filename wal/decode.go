package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The hot messages (Begin, Insert, Commit) are decoded here rather than with
// pglogrepl.Parse: pglogrepl allocates a struct per column and copies every
// value byte by byte, which dominates CPU at outbox rates. This decoder aliases
// the receive buffer and reuses the Msg's value slice, so a steady stream of
// inserts decodes without allocating. Every read is bounds-checked: a malformed
// message is an error, never a panic.

var errShort = errors.New("pgoutput message truncated")

// pgEpoch is 2000-01-01, the origin of PostgreSQL timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()

func pgTime(micros int64) time.Time { return time.UnixMicro(pgEpoch + micros).UTC() }

type reader struct {
	b   []byte
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if len(r.b) < n {
		r.err = errShort
		return false
	}
	return true
}

func (r *reader) u8() byte {
	if !r.need(1) {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if n < 0 || !r.need(n) {
		r.err = errShort
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// cstring reads a NUL-terminated string.
func (r *reader) cstring() string {
	if r.err != nil {
		return ""
	}
	i := bytes.IndexByte(r.b, 0)
	if i < 0 {
		r.err = errShort
		return ""
	}
	s := string(r.b[:i])
	r.b = r.b[i+1:]
	return s
}

// decoder holds the relation cache, which is the only state pgoutput requires:
// every row names its relation by OID, announced earlier in the same session.
type decoder struct {
	relations map[uint32]*Relation
	binary    binaryFunc // binary mode: the columns the caller renders (nil: text)
	settings  Settings
}

func newDecoder() *decoder { return &decoder{relations: make(map[uint32]*Relation)} }

// decode fills m from one pgoutput message. It reports handled=false for
// messages that carry nothing for the caller (Relation, Type, Origin), which
// only update state.
//
// oversize > 0 says data is only the start of a message of that many bytes
// (see StartOptions.MaxBodyBytes): a row or logical message then decodes as
// far as it goes, marked Oversize; any other kind is an error.
func (d *decoder) decode(data []byte, m *Msg, oversize int) (handled bool, err error) {
	if len(data) == 0 {
		return false, errShort
	}
	m.Row.Oversize, m.Message.Oversize = oversize, oversize
	r := reader{b: data[1:]}
	switch data[0] {
	case 'B':
		m.Kind = KindBegin
		m.Begin.FinalLSN = LSN(r.u64())
		m.Begin.CommitTime = pgTime(int64(r.u64()))
		m.Begin.Xid = r.u32()
	case 'C':
		m.Kind = KindCommit
		r.u8() // flags, unused
		m.Commit.CommitLSN = LSN(r.u64())
		m.Commit.EndLSN = LSN(r.u64())
		m.Commit.CommitTime = pgTime(int64(r.u64()))
	case 'I':
		m.Kind = KindInsert
		if err := d.row(&r, m, 'N'); err != nil && !cutShort(err, oversize) {
			return false, err
		}
	case 'U':
		m.Kind = KindUpdate
		if err := d.update(&r, m); err != nil && !cutShort(err, oversize) {
			return false, err
		}
	case 'D':
		m.Kind = KindDelete
		if err := d.row(&r, m, 'K', 'O'); err != nil && !cutShort(err, oversize) {
			return false, err
		}
	case 'T':
		m.Kind = KindTruncate
		n := int(r.u32())
		r.u8() // options
		m.Truncated = m.Truncated[:0]
		for i := 0; i < n && r.err == nil; i++ {
			rel, err := d.relation(r.u32())
			if err != nil {
				return false, err
			}
			m.Truncated = append(m.Truncated, rel)
		}
	case 'M':
		m.Kind = KindMessage
		m.Message.Transactional = r.u8()&1 == 1
		m.Message.LSN = LSN(r.u64())
		m.Message.Prefix = r.cstring()
		if oversize > 0 {
			r.u32()
			m.Message.Content = r.b // what there is of it
		} else {
			m.Message.Content = r.bytes(int(r.u32()))
		}
	case 'R':
		return false, d.decodeRelation(&r)
	case 'Y', 'O':
		return false, nil // type and origin announcements: nothing to route
	default:
		return false, fmt.Errorf("pgoutput: unexpected message type %q", data[0])
	}
	if oversize > 0 {
		switch data[0] {
		case 'I', 'U', 'D', 'M':
			if errors.Is(r.err, errShort) || r.err == nil {
				return true, nil // the columns that fitted
			}
		default:
			return false, fmt.Errorf("pgoutput %q message of %d bytes: larger than outboxd reads (%w)", data[0], oversize, errShort)
		}
	}
	if r.err != nil {
		return false, fmt.Errorf("pgoutput %q message: %w", data[0], r.err)
	}
	return true, nil
}

// cutShort: err is the end of a message the stream cut (oversize > 0).
func cutShort(err error, oversize int) bool { return oversize > 0 && errors.Is(err, errShort) }

func (d *decoder) decodeRelation(r *reader) error {
	id := r.u32()
	namespace, name := r.cstring(), r.cstring()
	r.u8() // replica identity setting
	n := int(r.u16())
	if r.err == nil && n > len(r.b) {
		return fmt.Errorf("pgoutput relation: %w", errShort)
	}
	cols := make([]Column, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		flags := r.u8()
		cols = append(cols, Column{Name: r.cstring(), TypeOID: r.u32(), Key: flags&1 == 1})
		r.u32() // type modifier
	}
	if r.err != nil {
		return fmt.Errorf("pgoutput relation: %w", r.err)
	}
	rel := NewRelation(id, namespace, name, cols)
	if err := d.checkBinary(rel); err != nil {
		return err
	}
	d.relations[id] = rel
	return nil
}

func (d *decoder) relation(id uint32) (*Relation, error) {
	rel, ok := d.relations[id]
	if !ok {
		return nil, fmt.Errorf("pgoutput: row for relation %d arrived before its Relation message", id)
	}
	return rel, nil
}

// row decodes "relid, tag, TupleData" where tag must be one of tags.
func (d *decoder) row(r *reader, m *Msg, tags ...byte) error {
	rel, err := d.relation(r.u32())
	if r.err != nil {
		return r.err
	}
	if err != nil {
		return err
	}
	tag := r.u8()
	if bytes.IndexByte(tags, tag) < 0 && r.err == nil {
		return fmt.Errorf("pgoutput: unexpected tuple tag %q", tag)
	}
	m.Row.Relation = rel
	return tuple(r, &m.Row)
}

// update decodes "relid, ['K'|'O' old], 'N' new" and keeps the new tuple.
func (d *decoder) update(r *reader, m *Msg) error {
	rel, err := d.relation(r.u32())
	if r.err != nil {
		return r.err
	}
	if err != nil {
		return err
	}
	m.Row.Relation = rel
	tag := r.u8()
	if tag == 'K' || tag == 'O' {
		if err := tuple(r, &m.Row); err != nil {
			return err
		}
		tag = r.u8()
	}
	if tag != 'N' && r.err == nil {
		return fmt.Errorf("pgoutput: unexpected update tuple tag %q", tag)
	}
	return tuple(r, &m.Row)
}

func tuple(r *reader, row *Row) error {
	n := int(r.u16())
	if r.err == nil && n > len(r.b) {
		return errShort
	}
	vals := row.Values[:0]
	for i := 0; i < n && r.err == nil; i++ {
		v := Value{Kind: r.u8()}
		switch v.Kind {
		case ValueText, ValueBinary:
			v.Data = r.bytes(int(r.u32()))
		case ValueNull, ValueUnchanged:
		default:
			if r.err == nil {
				return fmt.Errorf("pgoutput: unknown tuple value kind %q", v.Kind)
			}
		}
		if r.err != nil {
			break // a value cut short is not kept
		}
		vals = append(vals, v)
	}
	row.Values = vals
	return r.err
}
