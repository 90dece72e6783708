package router

import (
	"encoding/binary"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/wal"
)

// Binary pgoutput (wal.StartOptions.Binary). The walsender then sends each
// column's binary send form, and the router turns it back into exactly the
// text the server's output function would have sent, before routing: the
// records are byte for byte those of text mode, and the formatting work
// moves from the walsender (the relay's bottleneck) to outboxd.
//
// RendersBinary lists the types that can be rendered with certainty. The
// others keep the session in text mode: the binary option is per session,
// not per column.

// More type OIDs, beside values.go's.
const (
	oidName    = 19
	oidText    = 25
	oidBpchar  = 1042
	oidVarchar = 1043
	oidUUID    = 2950
)

// RendersBinary reports whether the router turns type oid's binary send
// form into exactly the server's text output under the session settings s.
// It is what cmd/outboxd passes as wal.StartOptions.Binary.
//
// Types whose text depends on settings are rendered only under the settings
// the rendering reproduces: timestamps need DateStyle ISO, timestamptz also
// a UTC TimeZone (another zone's offsets would need the server's time zone
// database, which outboxd's may not match), bytea needs bytea_output hex.
func RendersBinary(oid uint32, s wal.Settings) bool {
	switch oid {
	case oidBool, oidInt2, oidInt4, oidInt8, oidText, oidVarchar, oidBpchar, oidName, oidJSON, oidJSONB, oidUUID:
		return true
	case oidBytea:
		return s.ByteaOutput == "hex"
	case oidTimestamp:
		return isoDates(s.DateStyle)
	case oidTimestamptz:
		return isoDates(s.DateStyle) && utcZone(s.TimeZone)
	}
	return false
}

func isoDates(dateStyle string) bool { return strings.HasPrefix(dateStyle, "ISO") }

// utcZone: time zone names whose offset is +00 at every instant.
func utcZone(tz string) bool {
	switch strings.TrimPrefix(tz, "Etc/") {
	case "UTC", "UCT", "GMT", "GMT0", "GMT+0", "GMT-0", "Greenwich", "Universal", "Zulu":
		return true
	}
	return false
}

// AppendText appends the text PostgreSQL's output function gives for the
// value of type oid whose binary send form is bin (under the settings
// RendersBinary requires). ok is false for a type RendersBinary refuses
// and for a malformed value.
func AppendText(dst []byte, oid uint32, bin []byte) ([]byte, bool) {
	switch oid {
	case oidText, oidVarchar, oidBpchar, oidName, oidJSON:
		return append(dst, bin...), true // the send form is the text
	case oidJSONB:
		if len(bin) == 0 || bin[0] != 1 {
			return dst, false // version 1 is the only one
		}
		return append(dst, bin[1:]...), true
	case oidBool:
		if len(bin) != 1 {
			return dst, false
		}
		if bin[0] != 0 {
			return append(dst, 't'), true
		}
		return append(dst, 'f'), true
	case oidInt2:
		if len(bin) != 2 {
			return dst, false
		}
		return strconv.AppendInt(dst, int64(int16(binary.BigEndian.Uint16(bin))), 10), true
	case oidInt4:
		if len(bin) != 4 {
			return dst, false
		}
		return strconv.AppendInt(dst, int64(int32(binary.BigEndian.Uint32(bin))), 10), true
	case oidInt8:
		if len(bin) != 8 {
			return dst, false
		}
		return strconv.AppendInt(dst, int64(binary.BigEndian.Uint64(bin)), 10), true
	case oidUUID:
		if len(bin) != 16 {
			return dst, false
		}
		for i, b := range bin {
			if i == 4 || i == 6 || i == 8 || i == 10 {
				dst = append(dst, '-')
			}
			dst = append(dst, hexDigits[b>>4], hexDigits[b&0xF])
		}
		return dst, true
	case oidBytea:
		dst = append(dst, '\\', 'x')
		for _, b := range bin {
			dst = append(dst, hexDigits[b>>4], hexDigits[b&0xF])
		}
		return dst, true
	case oidTimestamp, oidTimestamptz:
		if len(bin) != 8 {
			return dst, false
		}
		return appendTimestamp(dst, int64(binary.BigEndian.Uint64(bin)), oid == oidTimestamptz), true
	}
	return dst, false
}

// appendTimestamp formats µs since 2000-01-01 as timestamp_out and (with
// tz, in UTC) timestamptz_out do with DateStyle ISO:
// "2024-05-01 12:34:56.1234+00", the fraction without trailing zeros and
// absent when zero, at least four year digits, " BC" last.
func appendTimestamp(dst []byte, us int64, tz bool) []byte {
	switch us {
	case 1<<63 - 1:
		return append(dst, "infinity"...)
	case -1 << 63:
		return append(dst, "-infinity"...)
	}
	sec, frac := us/1e6, us%1e6
	if frac < 0 {
		sec, frac = sec-1, frac+1e6
	}
	t := time.Unix(946684800+sec, 0).UTC()
	year, month, day := t.Date()
	hour, minute, second := t.Clock()
	bc := false
	if year <= 0 {
		year, bc = 1-year, true // Go's year 0 is 1 BC, as PostgreSQL's
	}
	if year < 1000 {
		dst = append(dst, "000"[:3-digits(year)+1]...)
	}
	dst = strconv.AppendInt(dst, int64(year), 10)
	dst = append(dst, '-')
	dst = append2(dst, int(month))
	dst = append(dst, '-')
	dst = append2(dst, day)
	dst = append(dst, ' ')
	dst = append2(dst, hour)
	dst = append(dst, ':')
	dst = append2(dst, minute)
	dst = append(dst, ':')
	dst = append2(dst, second)
	if frac != 0 {
		var f [7]byte
		f[0] = '.'
		n := int(frac)
		for i := 6; i >= 1; i-- {
			f[i] = byte('0' + n%10)
			n /= 10
		}
		end := 7
		for f[end-1] == '0' {
			end--
		}
		dst = append(dst, f[:end]...)
	}
	if tz {
		dst = append(dst, '+', '0', '0')
	}
	if bc {
		dst = append(dst, " BC"...)
	}
	return dst
}

// digits is the number of decimal digits of 0 < n < 1000.
func digits(n int) int {
	switch {
	case n >= 100:
		return 3
	case n >= 10:
		return 2
	}
	return 1
}

func append2(dst []byte, n int) []byte { return append(dst, byte('0'+n/10), byte('0'+n%10)) }

// binRow is the router's scratch for a binary row's text form, reused from
// row to row (the router serves one goroutine).
type binRow struct {
	row  wal.Row
	vals []wal.Value
	buf  []byte
	ends []int
}

// textForm returns row itself when it holds no binary value, and otherwise a
// row whose binary values are replaced by their text form, valid until the
// next call. bad names the first column whose binary value is malformed
// (kept as sent).
func (r *Router) textForm(row *wal.Row) (out *wal.Row, bad string) {
	i := 0
	for i < len(row.Values) && row.Values[i].Kind != wal.ValueBinary {
		i++
	}
	if i == len(row.Values) {
		return row, ""
	}
	b := &r.bin
	b.vals = append(b.vals[:0], row.Values...)
	b.buf, b.ends = b.buf[:0], b.ends[:0]
	cols := row.Relation.Columns
	// First render into one buffer, then point the values into it: the
	// buffer may move while it grows.
	for ; i < len(b.vals); i++ {
		v := &b.vals[i]
		if v.Kind != wal.ValueBinary {
			continue
		}
		var oid uint32
		if i < len(cols) {
			oid = cols[i].TypeOID
		}
		switch oid {
		case oidText, oidVarchar, oidBpchar, oidName, oidJSON:
			v.Kind = wal.ValueText // the same bytes: no copy
			continue
		case oidJSONB:
			if len(v.Data) > 0 && v.Data[0] == 1 {
				v.Kind, v.Data = wal.ValueText, v.Data[1:]
				continue
			}
		}
		start := len(b.buf)
		var ok bool
		if b.buf, ok = AppendText(b.buf, oid, v.Data); !ok {
			b.buf = b.buf[:start]
			if bad == "" {
				name := strconv.Itoa(i)
				if i < len(cols) {
					name = strconv.Quote(cols[i].Name)
				}
				bad = "column " + name + " has a malformed binary value of type OID " + strconv.FormatUint(uint64(oid), 10)
			}
			v.Kind = wal.ValueText
			continue
		}
		b.ends = append(b.ends, i, start, len(b.buf))
	}
	for j := 0; j < len(b.ends); j += 3 {
		v := &b.vals[b.ends[j]]
		v.Kind, v.Data = wal.ValueText, b.buf[b.ends[j+1]:b.ends[j+2]:b.ends[j+2]]
	}
	b.row = *row
	b.row.Values = b.vals
	return &b.row, bad
}

// hexDigits are bytea's hex output digits (lower case, as PostgreSQL writes them).
const hexDigits = "0123456789abcdef"
