package router

import (
	"encoding/base64"
	"strings"
	"time"
)

// PostgreSQL type OIDs the router treats specially. Every other type is
// handled as the text PostgreSQL sent.
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidJSON        = 114
	oidFloat4      = 700
	oidFloat8      = 701
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidNumeric     = 1700
	oidJSONB       = 3802
)

func isIntOID(oid uint32) bool { return oid == oidInt2 || oid == oidInt4 || oid == oidInt8 }

func isNumericOID(oid uint32) bool {
	switch oid {
	case oidInt2, oidInt4, oidInt8, oidFloat4, oidFloat8, oidNumeric:
		return true
	}
	return false
}

func isJSONOID(oid uint32) bool { return oid == oidJSON || oid == oidJSONB }

// ---- raw bytes: the value as it goes on the wire (bytea decoded) ----

// rawLen is an upper bound of the bytes appendRaw appends for data of type oid.
func rawLen(oid uint32, data []byte) int {
	if oid == oidBytea && len(data) >= 2 && data[0] == '\\' && data[1] == 'x' {
		return (len(data) - 2) / 2
	}
	return len(data)
}

// appendRaw appends data's wire bytes: bytea is decoded from PostgreSQL's
// text form (hex "\x…" or the legacy escape format), everything else is
// copied verbatim. ok is false for malformed bytea text.
func appendRaw(dst []byte, oid uint32, data []byte) ([]byte, bool) {
	if oid != oidBytea {
		return append(dst, data...), true
	}
	return appendBytea(dst, data)
}

func appendBytea(dst, data []byte) ([]byte, bool) {
	if len(data) >= 2 && data[0] == '\\' && data[1] == 'x' {
		h := data[2:]
		if len(h)%2 != 0 {
			return dst, false
		}
		for i := 0; i < len(h); i += 2 {
			hi, ok1 := unhex(h[i])
			lo, ok2 := unhex(h[i+1])
			if !ok1 || !ok2 {
				return dst, false
			}
			dst = append(dst, hi<<4|lo)
		}
		return dst, true
	}
	// bytea_output = 'escape': "\\" is a backslash, "\ooo" an octal byte.
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		if i+1 < len(data) && data[i+1] == '\\' {
			dst = append(dst, '\\')
			i++
			continue
		}
		if i+3 < len(data) && isOctal(data[i+1]) && isOctal(data[i+2]) && isOctal(data[i+3]) && data[i+1] <= '3' {
			dst = append(dst, (data[i+1]-'0')<<6|(data[i+2]-'0')<<3|(data[i+3]-'0'))
			i += 3
			continue
		}
		return dst, false
	}
	return dst, true
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// ---- JSON encoding ----

// isJSONNumber reports whether b is a JSON number (RFC 8259 grammar), so
// that PostgreSQL's "NaN" or "Infinity" are not embedded as numbers.
func isJSONNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return false
	}
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	} else {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i == len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// jsonValueLen is an upper bound of what appendJSONValue appends.
func jsonValueLen(oid uint32, v valueRef, numbers bool) int {
	if v.null {
		return 4
	}
	switch {
	case isJSONOID(oid):
		return len(v.data)
	case oid == oidBool && numbers:
		return 5
	case isNumericOID(oid) && numbers:
		return jacksonStringLen(v.data) // covers both the bare and the quoted form
	case oid == oidBytea:
		return base64.StdEncoding.EncodedLen(rawLen(oid, v.data)) + 2
	}
	return jacksonStringLen(v.data)
}

// appendJSONValue appends a column value as JSON: NULL as null, json and
// jsonb verbatim, bytea as a base64 string (as Kafka's JsonConverter writes
// BYTES), and with numbers set, numeric types as bare numbers and bool as
// true/false; everything else is a JSON string of the text.
func appendJSONValue(dst []byte, oid uint32, v valueRef, numbers bool) ([]byte, bool) {
	if v.null {
		return append(dst, "null"...), true
	}
	switch {
	case isJSONOID(oid):
		return append(dst, v.data...), true
	case oid == oidBool && numbers:
		switch string(v.data) {
		case "t", "true":
			return append(dst, "true"...), true
		case "f", "false":
			return append(dst, "false"...), true
		}
	case isNumericOID(oid) && numbers:
		if isJSONNumber(v.data) {
			return append(dst, v.data...), true
		}
	case oid == oidBytea:
		raw, ok := appendBytea(nil, v.data) // rare: bytea inside a JSON envelope
		if !ok {
			return dst, false
		}
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		return append(dst, '"'), true
	}
	return appendJacksonString(dst, v.data), true
}

// valueRef is a column value: its text bytes, or NULL.
type valueRef struct {
	data []byte
	null bool
}

// ---- integers and timestamps ----

// parseInt parses a PostgreSQL integer's text form.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	neg := false
	i := 0
	if b[0] == '-' || b[0] == '+' {
		neg = b[0] == '-'
		i++
		if len(b) == 1 {
			return 0, false
		}
	}
	var n uint64
	for ; i < len(b); i++ {
		c := b[i]
		if !isDigit(c) {
			return 0, false
		}
		if n > (1<<63)/10 {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		if n > 1<<63 {
			return 0, false
		}
	}
	if neg {
		return -int64(n), true // n == 1<<63 wraps to MinInt64, which is right
	}
	if n > 1<<63-1 {
		return 0, false
	}
	return int64(n), true
}

// parseTimestamp parses PostgreSQL's ISO text form of timestamp and
// timestamptz: "2024-05-01 12:34:56.123456", optionally followed by a zone
// offset "+02", "-05:30" or "+05:30:15" (also "Z"). A value without an offset
// is taken as UTC. "infinity", "-infinity" and BC dates are rejected.
func parseTimestamp(b []byte) (time.Time, bool) {
	var v [len(timestampFields)]int
	i := 0
	for k, f := range timestampFields {
		if f.sep != "" {
			if i >= len(b) || strings.IndexByte(f.sep, b[i]) < 0 {
				return time.Time{}, false
			}
			i++
		}
		var ok bool
		if v[k], i, ok = readDigits(b, i, f.min, f.max); !ok || v[k] < f.lo || v[k] > f.hi {
			return time.Time{}, false
		}
	}
	nsec, i, ok := fraction(b, i)
	if !ok {
		return time.Time{}, false
	}
	offset, i, ok := zoneOffset(b, i)
	if !ok || i != len(b) { // trailing text such as " BC"
		return time.Time{}, false
	}
	t := time.Date(v[0], time.Month(v[1]), v[2], v[3], v[4], v[5], nsec, time.UTC)
	if t.Day() != v[2] {
		return time.Time{}, false // e.g. February 30th
	}
	return t.Add(-time.Duration(offset) * time.Second), true
}

// timestampFields are the fields of PostgreSQL's ISO timestamp, in order:
// the byte before each (one of sep), its digits, and its range.
var timestampFields = [...]struct {
	sep      string
	min, max int // digits
	lo, hi   int
}{
	{"", 4, 9, 0, 999999999}, // year
	{"-", 2, 2, 1, 12},       // month
	{"-", 2, 2, 1, 31},       // day; time.Date checks the month's length
	{" T", 2, 2, 0, 23},      // hour
	{":", 2, 2, 0, 59},       // minute
	{":", 2, 2, 0, 59},       // second
}

// zoneFields are a zone offset's hours, minutes and seconds; the later two
// are optional, each after a ':'.
var zoneFields = [...]struct{ lo, hi int }{{0, 99}, {0, 59}, {0, 59}}

// readDigits reads the decimal number at b[i:], of min to max digits.
func readDigits(b []byte, i, min, max int) (n, next int, ok bool) {
	start := i
	for i < len(b) && isDigit(b[i]) && i-start < max {
		n = n*10 + int(b[i]-'0')
		i++
	}
	return n, i, i-start >= min
}

// fraction reads ".ddd" (any number of digits, nanoseconds kept) as
// nanoseconds; none is 0.
func fraction(b []byte, i int) (nsec, next int, ok bool) {
	if i >= len(b) || b[i] != '.' {
		return 0, i, true
	}
	i++
	start := i
	for ; i < len(b) && isDigit(b[i]); i++ {
		if i-start < 9 {
			nsec = nsec*10 + int(b[i]-'0')
		}
	}
	n := i - start
	for d := n; d < 9; d++ {
		nsec *= 10
	}
	return nsec, i, n > 0
}

// zoneOffset reads "Z", or "+hh", "-hh:mm", "+hh:mm:ss", as seconds east
// of UTC; none is 0.
func zoneOffset(b []byte, i int) (offset, next int, ok bool) {
	if i >= len(b) {
		return 0, i, true
	}
	sign := 1
	switch b[i] {
	case 'Z':
		return 0, i + 1, true
	case '-':
		sign = -1
	case '+':
	default:
		return 0, i, true // trailing text: the caller refuses it
	}
	i++
	parsed := 0
	for k, f := range zoneFields {
		if k > 0 {
			if i >= len(b) || b[i] != ':' {
				break
			}
			i++
		}
		var n int
		if n, i, ok = readDigits(b, i, 2, 2); !ok || n < f.lo || n > f.hi {
			return 0, i, false
		}
		offset = offset*60 + n
		parsed++
	}
	for ; parsed < len(zoneFields); parsed++ {
		offset *= 60 // "+02" is 2h
	}
	return sign * offset, i, true
}

// ---- header values for LSN / xid / commit time ----

// lsnTextMax is the longest "XXXXXXXX/XXXXXXXX".
const lsnTextMax = 17

// appendLSN appends an LSN as PostgreSQL prints it ("16/B374D848").
func appendLSN(dst []byte, lsn uint64) []byte {
	dst = appendHex32(dst, uint32(lsn>>32))
	dst = append(dst, '/')
	return appendHex32(dst, uint32(lsn))
}

func appendHex32(dst []byte, v uint32) []byte {
	const digits = "0123456789ABCDEF"
	if v == 0 {
		return append(dst, '0')
	}
	var tmp [8]byte
	i := len(tmp)
	for v > 0 {
		i--
		tmp[i] = digits[v&0xF]
		v >>= 4
	}
	return append(dst, tmp[i:]...)
}
