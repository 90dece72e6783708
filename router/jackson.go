package router

import (
	"encoding/base64"
	"unicode/utf8"
)

// Every JSON string outboxd writes (a json-string key or value, an envelope
// field, a dead letter) is escaped the way Kafka's JsonConverter (Jackson)
// writes a Java string, so that a json-string key is Debezium's bytes, and
// lands on Debezium's murmur2 partition. Jackson escapes '"', '\\' and
// control characters (\b \t \n \f \r, the others as \u00XX with upper-case
// hex) and writes a character outside the Basic Multilingual Plane as its two
// escaped UTF-16 surrogates (\uD83D\uDE00); everything else, '/', '<' and
// U+2028/U+2029 included, is written as is. (encoding/json differs on the
// last three: raw UTF-8 beyond the BMP, escaped U+2028/U+2029, lower-case
// hex.) Bytes that are not UTF-8 (impossible in a UTF8 database's text)
// become \uFFFD.
//
// value.format json-string: the payload as JsonConverter writes Debezium's
// STRING payload: a NULL payload is the JSON null, a bytea one a base64
// JSON string.

const hexUpper = "0123456789ABCDEF"

// jacksonStringLen is the exact length appendJacksonString appends.
func jacksonStringLen(src []byte) int {
	n := 2
	for i := 0; i < len(src); {
		b := src[i]
		if b < utf8.RuneSelf {
			switch {
			case b == '"' || b == '\\' || b == '\b' || b == '\t' || b == '\n' || b == '\f' || b == '\r':
				n += 2
			case b < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		c, size := utf8.DecodeRune(src[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			n += 6 // \uFFFD
		case c > 0xFFFF:
			n += 12
		default:
			n += size
		}
		i += size
	}
	return n
}

// appendJacksonString appends src as a JSON string with Jackson's escaping
// (see above).
func appendJacksonString(dst, src []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(src); {
		b := src[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, src[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\r':
				dst = append(dst, '\\', 'r')
			default:
				dst = appendU(dst, rune(b))
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRune(src[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, src[start:i]...)
			dst = appendU(dst, utf8.RuneError)
			start = i + size
		case c > 0xFFFF:
			dst = append(dst, src[start:i]...)
			c -= 0x10000
			dst = appendU(dst, 0xD800+(c>>10))
			dst = appendU(dst, 0xDC00+(c&0x3FF))
			start = i + size
		}
		i += size
	}
	dst = append(dst, src[start:]...)
	return append(dst, '"')
}

// jacksonValueLen is the exact length appendJacksonValue appends.
func jacksonValueLen(oid uint32, v valueRef) int {
	if v.null {
		return len("null")
	}
	if oid == oidBytea {
		raw, _ := appendBytea(nil, v.data)
		return 2 + base64.StdEncoding.EncodedLen(len(raw))
	}
	return jacksonStringLen(v.data)
}

// appendJacksonValue appends the payload as a JSON value (see above).
func appendJacksonValue(dst []byte, oid uint32, v valueRef) ([]byte, bool) {
	if v.null {
		return append(dst, "null"...), true
	}
	if oid == oidBytea {
		raw, ok := appendBytea(nil, v.data)
		if !ok {
			return dst, false
		}
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		return append(dst, '"'), true
	}
	return appendJacksonString(dst, v.data), true
}

func appendU(dst []byte, c rune) []byte {
	return append(dst, '\\', 'u', hexUpper[c>>12&0xF], hexUpper[c>>8&0xF], hexUpper[c>>4&0xF], hexUpper[c&0xF])
}
