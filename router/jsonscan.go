package router

import (
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A small allocation-free JSON reader for the two shapes the hot path meets:
// an object of string values (the headers column) and the top level of a
// logical message's event object.

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

// scanString validates the JSON string starting at b[i] == '"' and returns
// the index just past its closing quote, or -1.
func scanString(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			i++
			if i >= len(b) {
				return -1
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return -1
				}
				for _, h := range b[i+1 : i+5] {
					if _, ok := unhex(h); !ok {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

// scanHeaderObject checks that b is a JSON object whose values are all
// strings, whose keys g does not reserve and whose member count g allows,
// and returns that count. JSON null counts as no headers. reason is
// non-empty when b has another shape.
// detail quotes the offending key.
func scanHeaderObject(b []byte, g *headerGuard) (n int, reason, detail string) {
	var scratch [64]byte
	i := skipSpace(b, 0)
	if i+4 <= len(b) && string(b[i:i+4]) == "null" && skipSpace(b, i+4) == len(b) {
		return 0, "", ""
	}
	if i >= len(b) || b[i] != '{' {
		return 0, "not a JSON object", ""
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		if skipSpace(b, i+1) != len(b) {
			return 0, "not a JSON object", ""
		}
		return 0, "", ""
	}
	for {
		end := scanString(b, i)
		if end < 0 {
			return 0, "not a JSON object", ""
		}
		keyStart := i
		key := b[i+1 : end-1]
		for _, c := range key {
			if c == '\\' {
				key = appendUnquoted(scratch[:0], key) // rare: escapes in a header name
				break
			}
		}
		if g.reserved(key) {
			return 0, reservedHeaderReason, "header " + quoteValue(key)
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return 0, "not a JSON object", ""
		}
		i = skipSpace(b, i+1)
		if end = scanString(b, i); end < 0 {
			if i < len(b) && isValueStart(b[i]) {
				key := appendUnquoted(nil, b[keyStart+1:skipBack(b, keyStart)])
				return 0, "a header value is not a string", "header " + quoteValue(key)
			}
			return 0, "not a JSON object", ""
		}
		n++
		if n > g.max {
			return 0, "more than " + strconv.Itoa(g.max) + " headers", ""
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return 0, "not a JSON object", ""
		}
		if b[i] == '}' {
			if skipSpace(b, i+1) != len(b) {
				return 0, "not a JSON object", ""
			}
			return n, "", ""
		}
		if b[i] != ',' {
			return 0, "not a JSON object", ""
		}
		i = skipSpace(b, i+1)
	}
}

// skipBack returns the index of the closing quote of the string at b[i].
func skipBack(b []byte, i int) int { return scanString(b, i) - 1 }

func isValueStart(c byte) bool {
	return c == '{' || c == '[' || c == '-' || c == 't' || c == 'f' || c == 'n' || isDigit(c)
}

// decodeHeaderObject appends the members of an object scanHeaderObject
// accepted: values decoded into buf, keys interned.
func decodeHeaderObject(b, buf []byte, hdrs []Header, intern func([]byte) string) ([]byte, []Header) {
	i := skipSpace(b, 0)
	if b[i] != '{' {
		return buf, hdrs // null
	}
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		end := scanString(b, i)
		start := len(buf)
		buf = appendUnquoted(buf, b[i+1:end-1])
		key := intern(buf[start:])
		buf = buf[:start]
		i = skipSpace(b, end)
		i = skipSpace(b, i+1) // ':'
		end = scanString(b, i)
		buf = appendUnquoted(buf, b[i+1:end-1])
		hdrs = append(hdrs, Header{Key: key, Value: buf[start:len(buf):len(buf)]})
		i = skipSpace(b, end)
		if b[i] == '}' {
			break
		}
		i = skipSpace(b, i+1) // ','
	}
	return buf, hdrs
}

// appendUnquoted appends the decoded contents of a valid JSON string (the
// bytes between its quotes). Lone surrogates become U+FFFD, as encoding/json
// does. The result is never longer than s.
func appendUnquoted(dst, s []byte) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		i++
		switch s[i] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := rune(hex4(s[i+1:]))
			i += 4
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if i+6 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
					r2 = utf16.DecodeRune(r, rune(hex4(s[i+3:])))
				}
				if r2 != utf8.RuneError {
					i += 6
					r = r2
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, s[i])
		}
	}
	return dst
}

func hex4(b []byte) uint16 {
	var v uint16
	for _, c := range b[:4] {
		h, _ := unhex(c)
		v = v<<4 | uint16(h)
	}
	return v
}

// skipValue returns the index just past the JSON value starting at b[i],
// which must be valid JSON (checked beforehand with json.Valid).
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return scanString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = scanString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for i < len(b) && !isJSONSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
		i++
	}
	return i
}
