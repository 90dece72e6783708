package router

import (
	"encoding/base64"
	"unicode/utf8"
)

// value.format json-string: the payload the way Kafka's JsonConverter
// (Jackson) writes Debezium's STRING payload, so consumers that parse
// Debezium's JSON-string values read outboxd's unchanged. Jackson escapes
// '"', '\\' and control characters (\b \t \n \f \r, the others as \u00XX
// with upper-case hex) and writes a character outside the Basic
// Multilingual Plane as its two escaped UTF-16 surrogates (\uD83D\uDE00);
// everything else, '/' and U+2028 included, is written as is. A NULL payload
// is the JSON null, a bytea one a base64 JSON string.

const hexUpper = "0123456789ABCDEF"

// jacksonValueLen is the exact length appendJacksonValue appends.
func jacksonValueLen(oid uint32, v valueRef) int {
	if v.null {
		return len("null")
	}
	if oid == oidBytea {
		raw, _ := appendBytea(nil, v.data)
		return 2 + base64.StdEncoding.EncodedLen(len(raw))
	}
	n := 2
	for i := 0; i < len(v.data); {
		b := v.data[i]
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
		c, size := utf8.DecodeRune(v.data[i:])
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
	dst = append(dst, '"')
	for i := 0; i < len(v.data); {
		b := v.data[i]
		if b < utf8.RuneSelf {
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
				if b < 0x20 {
					dst = appendU(dst, rune(b))
				} else {
					dst = append(dst, b)
				}
			}
			i++
			continue
		}
		c, size := utf8.DecodeRune(v.data[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = appendU(dst, utf8.RuneError)
		case c > 0xFFFF:
			c -= 0x10000
			dst = appendU(dst, 0xD800+(c>>10))
			dst = appendU(dst, 0xDC00+(c&0x3FF))
		default:
			dst = append(dst, v.data[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"'), true
}

func appendU(dst []byte, c rune) []byte {
	return append(dst, '\\', 'u', hexUpper[c>>12&0xF], hexUpper[c>>8&0xF], hexUpper[c>>4&0xF], hexUpper[c&0xF])
}
