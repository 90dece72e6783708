package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// table.expand.json.payload, as Debezium 3.6's EventRouter does it and Kafka's
// JsonConverter (schemas.enable=false) then writes it. Debezium parses a
// STRING payload that starts with '{' or '[' with Jackson, infers a Connect
// schema from the tree (JsonSchemaData.toConnectSchema), converts the tree
// into a Struct of that schema (toConnectData), and JsonConverter writes the
// Struct compactly. outboxd reproduces the bytes (value.format: json-string;
// with raw values the payload already goes out as the JSON it is):
//
//   - members are written in order of first appearance, a repeated member
//     with its last value (Jackson's readTree);
//   - a member whose value is null is dropped (table.json.payload.null.behavior
//     ignore, the default), or kept as null (optional_bytes); so is an empty
//     array, always (its element schema cannot be inferred);
//   - integers that fit 32 or 64 bits are written as parsed, other numbers as
//     Java's Double.toString writes a double (42.50 → 42.5, 1e3 → 1000.0,
//     -0.0001 → -1.0E-4);
//   - the objects of an array share one schema, the union of their members:
//     an element without a member gets it as null;
//   - strings are escaped as Jackson escapes them (jackson.go).
//
// Where Debezium's expansion fails before the schema is replaced (the text
// does not start with '{' or '[', is not JSON, or holds an array whose
// elements differ in type), Debezium logs a warning and keeps the STRING
// payload: outboxd writes the JSON string as without the option. Where it
// fails after (a top-level non-empty array, an integer beyond 64 bits, an
// array element of another type than the first's), JsonConverter cannot write
// the record (DataException: the task dies, or with errors.tolerance=all
// Connect skips the record): outboxd makes the event invalid (--on-invalid),
// saying why, instead of losing it.

// nullBehavior values of table.json.payload.null.behavior.
const (
	nullIgnore        = "ignore"
	nullOptionalBytes = "optional_bytes"
)

// jnode is a parsed JSON value.
type jnode struct {
	kind    byte // 'o' object, 'a' array, 's' string, 'b' bool, 'i' int32, 'l' int64, 'g' big integer, 'd' double, 'z' null
	text    string
	members []jmember // objects: unique names, first position, last value
	elems   []*jnode  // arrays
}

type jmember struct {
	name string
	val  *jnode
}

// cschema is the Connect schema Debezium infers ('s', 'b', 'i', 'l', 'd',
// 'y' optional bytes, 'a' array, 'o' struct).
type cschema struct {
	kind   byte
	elem   *cschema
	fields []cfield
}

type cfield struct {
	name string
	s    *cschema
}

// errKeep: the expansion fails before Debezium replaces the payload's schema;
// the payload stays a string.
var errKeep = errors.New("keep the string payload")

// expandPayload returns the payload as Debezium + JsonConverter write it with
// table.expand.json.payload: (out, "") on success; (nil, "") when the
// payload stays a JSON string; (nil, reason) when Debezium cannot write the
// record at all. envelope: the payload goes inside the envelope struct.
func expandPayload(dst, text []byte, optionalBytes, envelope bool) ([]byte, string) {
	if len(text) == 0 || (text[0] != '{' && text[0] != '[') {
		return nil, ""
	}
	n, err := parseJNode(json.NewDecoder(bytes.NewReader(text)))
	if err != nil {
		return nil, "" // Jackson cannot parse it either: a warning, the string stays
	}
	s, err := inferSchema(n, optionalBytes)
	if err != nil {
		return nil, ""
	}
	switch {
	case n.kind == 'a' && s == nil && !envelope:
		// An empty array: no schema; the Struct conversion fails on it and
		// the STRING value goes out without a schema.
		return nil, ""
	case n.kind == 'a':
		return nil, "table.expand.json.payload: the payload is a JSON array, which Debezium's expansion cannot make a Struct of (JsonConverter then rejects the record)"
	}
	out, reason := writeConnect(dst, n, s)
	if reason != "" {
		return nil, "table.expand.json.payload: Debezium's JsonConverter cannot write this payload: " + reason
	}
	return out, ""
}

// parseJNode reads one JSON value (trailing text is ignored, as Jackson's
// readTree does).
func parseJNode(d *json.Decoder) (*jnode, error) {
	d.UseNumber()
	return readJNode(d, 0)
}

func readJNode(d *json.Decoder, depth int) (*jnode, error) {
	if depth > 1000 { // Jackson's StreamReadConstraints default
		return nil, errKeep
	}
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			n := &jnode{kind: 'o'}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				name, _ := kt.(string)
				v, err := readJNode(d, depth+1)
				if err != nil {
					return nil, err
				}
				replaced := false
				for i := range n.members {
					if n.members[i].name == name {
						n.members[i].val, replaced = v, true
						break
					}
				}
				if !replaced {
					n.members = append(n.members, jmember{name, v})
				}
			}
			_, err := d.Token()
			return n, err
		}
		n := &jnode{kind: 'a'}
		for d.More() {
			v, err := readJNode(d, depth+1)
			if err != nil {
				return nil, err
			}
			n.elems = append(n.elems, v)
		}
		_, err := d.Token()
		return n, err
	case string:
		return &jnode{kind: 's', text: t}, nil
	case bool:
		if t {
			return &jnode{kind: 'b', text: "true"}, nil
		}
		return &jnode{kind: 'b', text: "false"}, nil
	case nil:
		return &jnode{kind: 'z'}, nil
	case json.Number:
		return numberNode(string(t))
	}
	return nil, errKeep
}

// numberNode classifies a number as Jackson's readTree does: an integer that
// fits an int is an IntNode, one that fits a long a LongNode, a larger one a
// BigIntegerNode; anything with a fraction or exponent a DoubleNode.
func numberNode(s string) (*jnode, error) {
	if strings.ContainsAny(s, ".eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, errKeep
		}
		return &jnode{kind: 'd', text: javaDouble(f)}, nil
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return &jnode{kind: 'g', text: s}, nil
	}
	if i >= math.MinInt32 && i <= math.MaxInt32 {
		return &jnode{kind: 'i', text: strconv.FormatInt(i, 10)}, nil
	}
	return &jnode{kind: 'l', text: strconv.FormatInt(i, 10)}, nil
}

// javaDouble formats f as Java's Double.toString: decimal notation with at
// least one fractional digit for 1e-3 <= |f| < 1e7, otherwise
// "d.dddE±n" (no '+'). The digits are the shortest that identify f.
func javaDouble(f float64) string {
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	abs := math.Abs(f)
	if abs >= 1e-3 && abs < 1e7 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // "-1.5e-04"
	mant, exp, _ := strings.Cut(s, "e")
	if !strings.Contains(mant, ".") {
		mant += ".0"
	}
	e, _ := strconv.Atoi(exp)
	return mant + "E" + strconv.Itoa(e)
}

// inferSchema is JsonSchemaData.toConnectSchema: nil for a value that gets
// no field (null with ignore, an empty array); errKeep where Debezium throws.
func inferSchema(n *jnode, optionalBytes bool) (*cschema, error) {
	switch n.kind {
	case 's', 'b', 'i', 'l':
		return &cschema{kind: n.kind}, nil
	case 'd', 'g':
		return &cschema{kind: 'd'}, nil
	case 'z':
		if optionalBytes {
			return &cschema{kind: 'y'}, nil
		}
		return nil, nil
	case 'o':
		s := &cschema{kind: 'o'}
		for _, m := range n.members {
			fs, err := inferSchema(m.val, optionalBytes)
			if err != nil {
				return nil, err
			}
			if fs != nil {
				s.fields = append(s.fields, cfield{m.name, fs})
			}
		}
		return s, nil
	case 'a':
		if len(n.elems) == 0 {
			return nil, nil
		}
		e, err := arrayElemSchema(n, optionalBytes)
		if err != nil {
			return nil, err
		}
		return &cschema{kind: 'a', elem: e}, nil
	}
	return nil, errKeep
}

// arrayElemSchema is toConnectSchemaWithCycles: the first non-null element
// decides; every non-null element must be of its JSON type (numbers: of its
// Connect type); objects merge into one struct (a member's first schema
// wins, unless it was optional bytes from a null).
func arrayElemSchema(n *jnode, optionalBytes bool) (*cschema, error) {
	var ref *jnode
	var refSchema *cschema
	for _, e := range n.elems {
		if e.kind == 'z' {
			continue
		}
		if ref == nil {
			ref = e
		}
		if jsonType(e.kind) != jsonType(ref.kind) {
			return nil, errKeep
		}
		if jsonType(ref.kind) == 'n' {
			if refSchema == nil {
				refSchema, _ = inferSchema(ref, optionalBytes)
			}
			es, _ := inferSchema(e, optionalBytes)
			if es.kind != refSchema.kind {
				return nil, errKeep
			}
		}
	}
	if ref == nil {
		ref = &jnode{kind: 'z'}
	}
	if ref.kind != 'o' {
		s, err := inferSchema(ref, optionalBytes)
		if err == nil && s == nil {
			err = errKeep // "Array has unrecognized member schema"
		}
		return s, err
	}
	// Debezium merges the distinct element schemas in HashSet order; outboxd
	// in order of appearance (the same result unless two shapes disagree on
	// a member's type or order).
	var merged *cschema
	for _, e := range n.elems {
		if e.kind != 'o' {
			continue
		}
		es, err := inferSchema(e, optionalBytes)
		if err != nil {
			return nil, err
		}
		if merged == nil {
			merged = es
			continue
		}
		for _, f := range es.fields {
			found := false
			for i := range merged.fields {
				if merged.fields[i].name == f.name {
					found = true
					if old := merged.fields[i].s; old.kind == 'y' && f.s.kind != 'y' {
						merged.fields[i].s = f.s
					}
					break
				}
			}
			if !found {
				merged.fields = append(merged.fields, f)
			}
		}
	}
	return merged, nil
}

// jsonType folds the number kinds into one JSON node type.
func jsonType(k byte) byte {
	switch k {
	case 'i', 'l', 'd', 'g':
		return 'n'
	}
	return k
}

// writeConnect converts n to the Struct of schema s and writes it as
// JsonConverter does; reason says why Connect would reject the value.
func writeConnect(dst []byte, n *jnode, s *cschema) ([]byte, string) {
	if n.kind == 'z' {
		return append(dst, "null"...), ""
	}
	switch s.kind {
	case 'o':
		if n.kind != 'o' {
			return nil, "a " + kindName(n.kind) + " where the inferred schema has an object"
		}
		dst = append(dst, '{')
		for i, f := range s.fields {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJacksonString(dst, []byte(f.name))
			dst = append(dst, ':')
			var v *jnode
			for _, m := range n.members {
				if m.name == f.name {
					v = m.val
					break
				}
			}
			if v == nil {
				dst = append(dst, "null"...)
				continue
			}
			var reason string
			if dst, reason = writeConnect(dst, v, f.s); reason != "" {
				return nil, strconv.Quote(f.name) + ": " + reason
			}
		}
		return append(dst, '}'), ""
	case 'a':
		if n.kind != 'a' {
			return nil, "a " + kindName(n.kind) + " where the inferred schema has an array"
		}
		dst = append(dst, '[')
		for i, e := range n.elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			var reason string
			if dst, reason = writeConnect(dst, e, s.elem); reason != "" {
				return nil, reason
			}
		}
		return append(dst, ']'), ""
	case 's':
		if n.kind == 's' {
			return appendJacksonString(dst, []byte(n.text)), ""
		}
	case 'b', 'i', 'l', 'd':
		if n.kind == s.kind {
			return append(dst, n.text...), ""
		}
	}
	if n.kind == 'g' {
		return nil, "integer " + n.text + " is beyond 64 bits (Debezium infers FLOAT64 and gets a BigDecimal)"
	}
	return nil, "a " + kindName(n.kind) + " where the inferred schema (from an earlier element) has another type"
}

func kindName(k byte) string {
	switch k {
	case 'o':
		return "object"
	case 'a':
		return "array"
	case 's':
		return "string"
	case 'b':
		return "boolean"
	case 'i', 'l', 'g':
		return "integer"
	case 'd':
		return "number"
	}
	return "null"
}

// expandsOID: Debezium gives the payload column to the expansion as a Java
// String: every type but bytea (a ByteBuffer), numbers and booleans.
func expandsOID(oid uint32) bool {
	return oid != oidBytea && oid != oidBool && !isNumericOID(oid)
}
