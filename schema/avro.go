package schema

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// The JSON ↔ Avro mapping. Outbox payloads are written by applications as
// plain JSON, not in Avro's own JSON encoding (which wraps every union value
// in {"type": value}), so outboxd maps the natural JSON shape onto the
// schema, and reads Avro back into that same shape (docs/schemas.md):
//
//	null                 JSON null
//	boolean              true / false
//	int, long            an integer JSON number within range; with the date
//	                     logical type also "2006-01-02", with timestamp-millis
//	                     / -micros (local- too) also an RFC 3339 string
//	float, double        any JSON number
//	string (uuid too)    a JSON string
//	bytes, fixed         a JSON string holding standard base64; with the
//	                     decimal logical type a JSON number or numeric string
//	                     with at most scale fraction digits
//	enum                 a JSON string naming a symbol
//	array, map           a JSON array, a JSON object
//	record               a JSON object: each field by name, a missing field
//	                     takes its default (an error without one), a member
//	                     the record has no field for is an error (it would be
//	                     lost silently otherwise)
//	union                null picks the null branch; {"name": value}, one
//	                     member naming a branch (Avro's JSON encoding), picks
//	                     that branch; otherwise the first branch, in schema
//	                     order, the value encodes as
//
// Reading gives the natural form: no union wrappers, bytes and fixed as
// base64, decimals as numeric strings, logical dates and timestamps as
// their numbers.

// mismatch is a payload that does not fit its schema, at a field path.
type mismatch struct {
	path   string // "amount", "items[2].sku"; "" for the value itself
	msg    string // names no value: errors reach /readyz
	detail string // may quote the value: the log and dead letters only
}

func (m *mismatch) Error() string {
	if m.path == "" {
		return "the value: " + m.msg
	}
	return "field " + m.path + ": " + m.msg
}

func mis(path, format string, a ...any) error {
	return &mismatch{path: path, msg: fmt.Sprintf(format, a...)}
}

func child(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// jsonKind names a decoded JSON value's type, for errors (never its value:
// errors reach /readyz).
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// decodeJSON parses a payload keeping numbers exact (json.Number).
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("data after the JSON value")
	}
	return v, nil
}

func appendLong(b []byte, n int64) []byte { return binary.AppendVarint(b, n) } // zig-zag varint

// appendAvro appends v, a decoded JSON value, as the Avro binary encoding of s.
func appendAvro(b []byte, s avro.Schema, v any, path string) ([]byte, error) {
	switch s := s.(type) {
	case *avro.RefSchema:
		return appendAvro(b, s.Schema(), v, path)
	case *avro.RecordSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, mis(path, "want an object (Avro record %s), got %s", s.FullName(), jsonKind(v))
		}
		seen := 0
		for _, f := range s.Fields() {
			fv, ok := obj[f.Name()]
			if ok {
				seen++
			}
			if !ok {
				if !f.HasDefault() {
					return nil, mis(child(path, f.Name()), "missing, and the schema gives it no default")
				}
				def, err := avro.Marshal(f.Type(), f.Default())
				if err != nil {
					return nil, mis(child(path, f.Name()), "missing, and its default does not encode: %v", err)
				}
				b = append(b, def...)
				continue
			}
			var err error
			if b, err = appendAvro(b, f.Type(), fv, child(path, f.Name())); err != nil {
				return nil, err
			}
		}
		if seen < len(obj) {
			for _, k := range sortedKeys(obj) {
				if !hasField(s, k) {
					return nil, mis(child(path, k), "not in the schema (record %s has no such field)", s.FullName())
				}
			}
		}
		return b, nil
	case *avro.UnionSchema:
		return appendUnion(b, s, v, path)
	case *avro.EnumSchema:
		str, ok := v.(string)
		if !ok {
			return nil, mis(path, "want a string (Avro enum %s), got %s", s.FullName(), jsonKind(v))
		}
		for i, sym := range s.Symbols() {
			if sym == str {
				return appendLong(b, int64(i)), nil
			}
		}
		return nil, mis(path, "not a symbol of enum %s (%s)", s.FullName(), strings.Join(s.Symbols(), ", "))
	case *avro.ArraySchema:
		arr, ok := v.([]any)
		if !ok {
			return nil, mis(path, "want an array, got %s", jsonKind(v))
		}
		if len(arr) > 0 {
			b = appendLong(b, int64(len(arr)))
			for i, it := range arr {
				var err error
				if b, err = appendAvro(b, s.Items(), it, path+"["+strconv.Itoa(i)+"]"); err != nil {
					return nil, err
				}
			}
		}
		return appendLong(b, 0), nil
	case *avro.MapSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, mis(path, "want an object (Avro map), got %s", jsonKind(v))
		}
		if len(obj) > 0 {
			b = appendLong(b, int64(len(obj)))
			for _, k := range sortedKeys(obj) { // deterministic bytes
				b = appendLong(b, int64(len(k)))
				b = append(b, k...)
				var err error
				if b, err = appendAvro(b, s.Values(), obj[k], child(path, k)); err != nil {
					return nil, err
				}
			}
		}
		return appendLong(b, 0), nil
	case *avro.FixedSchema:
		raw, err := bytesValue(v, s.Logical(), path)
		if err != nil {
			return nil, err
		}
		if d, ok := s.Logical().(*avro.DecimalLogicalSchema); ok && d != nil {
			return appendFixedDecimal(b, raw, s.Size(), path)
		}
		if len(raw) != s.Size() {
			return nil, mis(path, "want %d bytes (Avro fixed %s), got %d", s.Size(), s.FullName(), len(raw))
		}
		return append(b, raw...), nil
	case *avro.NullSchema:
		if v != nil {
			return nil, mis(path, "want null, got %s", jsonKind(v))
		}
		return b, nil
	case *avro.PrimitiveSchema:
		return appendPrimitive(b, s, v, path)
	}
	return nil, mis(path, "unsupported Avro type %s", s.Type())
}

func sortedKeys(obj map[string]any) []string {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func hasField(s *avro.RecordSchema, name string) bool {
	for _, f := range s.Fields() {
		if f.Name() == name {
			return true
		}
	}
	return false
}

func appendUnion(b []byte, s *avro.UnionSchema, v any, path string) ([]byte, error) {
	types := s.Types()
	if v == nil {
		for i, t := range types {
			if t.Type() == avro.Null {
				return appendLong(b, int64(i)), nil
			}
		}
		return nil, mis(path, "null, but the union %s has no null branch", s.String())
	}
	if obj, ok := v.(map[string]any); ok && len(obj) == 1 {
		for k, inner := range obj {
			for i, t := range types {
				if branchName(t) == k {
					bb, err := appendAvro(appendLong(b, int64(i)), t, inner, path)
					if err == nil {
						return bb, nil
					}
					if !isRecordLike(t) { // a wrapper naming a branch is meant as one
						return nil, err
					}
				}
			}
		}
	}
	var first error
	for i, t := range types {
		if t.Type() == avro.Null {
			continue
		}
		bb, err := appendAvro(appendLong(b, int64(i)), t, v, path)
		if err == nil {
			return bb, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		return nil, mis(path, "%s matches no branch of the union", jsonKind(v))
	}
	return nil, mis(path, "%s matches no branch of the union %s (first branch: %v)", jsonKind(v), s.String(), first)
}

// branchName is the name Avro's JSON encoding gives a union branch.
func branchName(s avro.Schema) string {
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return string(s.Type())
}

func isRecordLike(s avro.Schema) bool {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	t := s.Type()
	return t == avro.Record || t == avro.Map
}

func logicalType(l avro.LogicalSchema) avro.LogicalType {
	if l == nil {
		return ""
	}
	return l.Type()
}

func appendPrimitive(b []byte, s *avro.PrimitiveSchema, v any, path string) ([]byte, error) {
	switch s.Type() {
	case avro.Boolean:
		x, ok := v.(bool)
		if !ok {
			return nil, mis(path, "want a boolean, got %s", jsonKind(v))
		}
		if x {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case avro.Int, avro.Long:
		n, err := integer(v, s, path)
		if err != nil {
			return nil, err
		}
		return appendLong(b, n), nil
	case avro.Float, avro.Double:
		num, ok := v.(json.Number)
		if !ok {
			return nil, mis(path, "want a number (Avro %s), got %s", s.Type(), jsonKind(v))
		}
		f, err := strconv.ParseFloat(string(num), 64)
		if err != nil {
			return nil, mis(path, "not a finite number")
		}
		if s.Type() == avro.Float {
			if math.Abs(f) > math.MaxFloat32 {
				return nil, mis(path, "out of range for an Avro float")
			}
			return binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(f))), nil
		}
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(f)), nil
	case avro.String:
		str, ok := v.(string)
		if !ok {
			return nil, mis(path, "want a string, got %s", jsonKind(v))
		}
		b = appendLong(b, int64(len(str)))
		return append(b, str...), nil
	case avro.Bytes:
		raw, err := bytesValue(v, s.Logical(), path)
		if err != nil {
			return nil, err
		}
		b = appendLong(b, int64(len(raw)))
		return append(b, raw...), nil
	}
	return nil, mis(path, "unsupported Avro type %s", s.Type())
}

// integer reads an Avro int or long: an integer JSON number, or for the
// date and timestamp logical types their usual string forms.
func integer(v any, s *avro.PrimitiveSchema, path string) (int64, error) {
	lt := logicalType(s.Logical())
	if str, ok := v.(string); ok {
		switch lt {
		case avro.Date:
			t, err := time.Parse(time.DateOnly, str)
			if err != nil {
				return 0, mis(path, "want a date as 2006-01-02 or days since 1970-01-01")
			}
			return t.Unix() / 86400, nil
		case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
			t, err := time.Parse(time.RFC3339Nano, str)
			if err != nil {
				return 0, mis(path, "want an RFC 3339 timestamp or a number (%s)", lt)
			}
			if lt == avro.TimestampMillis || lt == avro.LocalTimestampMillis {
				return t.UnixMilli(), nil
			}
			return t.UnixMicro(), nil
		}
	}
	num, ok := v.(json.Number)
	if !ok {
		return 0, mis(path, "want an integer (Avro %s), got %s", s.Type(), jsonKind(v))
	}
	n, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil {
		return 0, mis(path, "want an integer (Avro %s), got a number with a fraction or out of range", s.Type())
	}
	if s.Type() == avro.Int && (n < math.MinInt32 || n > math.MaxInt32) {
		return 0, mis(path, "out of range for an Avro int (32 bits)")
	}
	return n, nil
}

// bytesValue reads bytes or fixed: base64 text, or with the decimal logical
// type the two's-complement unscaled value of a number.
func bytesValue(v any, l avro.LogicalSchema, path string) ([]byte, error) {
	if d, ok := l.(*avro.DecimalLogicalSchema); ok && d != nil {
		var text string
		switch x := v.(type) {
		case json.Number:
			text = string(x)
		case string:
			text = x
		default:
			return nil, mis(path, "want a decimal number, got %s", jsonKind(v))
		}
		r, ok := new(big.Rat).SetString(text)
		if !ok {
			return nil, mis(path, "want a decimal number")
		}
		r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale())), nil)))
		if !r.IsInt() {
			return nil, mis(path, "more fraction digits than the decimal's scale %d", d.Scale())
		}
		unscaled := r.Num()
		if d.Precision() > 0 && len(unscaled.String())-boolInt(unscaled.Sign() < 0) > d.Precision() {
			return nil, mis(path, "more digits than the decimal's precision %d", d.Precision())
		}
		return twosComplement(unscaled), nil
	}
	str, ok := v.(string)
	if !ok {
		return nil, mis(path, "want a base64 string (Avro bytes), got %s", jsonKind(v))
	}
	raw, err := base64.StdEncoding.DecodeString(str)
	if err != nil {
		return nil, mis(path, "not standard base64 (Avro bytes are base64 in JSON)")
	}
	return raw, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// twosComplement is n as big-endian two's complement in the fewest bytes,
// as Avro's decimal stores it.
func twosComplement(n *big.Int) []byte {
	if n.Sign() >= 0 {
		b := n.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return b
	}
	// -n = ^(n-1): invert the magnitude minus one.
	m := new(big.Int).Sub(new(big.Int).Neg(n), big.NewInt(1)).Bytes()
	for i := range m {
		m[i] = ^m[i]
	}
	if len(m) == 0 || m[0]&0x80 == 0 {
		m = append([]byte{0xff}, m...)
	}
	return m
}

func fromTwosComplement(b []byte) *big.Int {
	n := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	return n
}

func appendFixedDecimal(b, raw []byte, size int, path string) ([]byte, error) {
	if len(raw) > size {
		return nil, mis(path, "too large for the decimal's %d bytes", size)
	}
	pad := byte(0)
	if len(raw) > 0 && raw[0]&0x80 != 0 {
		pad = 0xff
	}
	for range size - len(raw) {
		b = append(b, pad)
	}
	return append(b, raw...), nil
}

// avroReader decodes Avro binary into the natural JSON form.
type avroReader struct {
	b   []byte
	err error
}

var errShort = fmt.Errorf("avro: the value ends early")

func (r *avroReader) long() int64 {
	n, k := binary.Varint(r.b)
	if k <= 0 {
		r.fail(errShort)
		return 0
	}
	r.b = r.b[k:]
	return n
}

func (r *avroReader) next(n int) []byte {
	if n < 0 || n > len(r.b) {
		r.fail(errShort)
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *avroReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

// read decodes one value of s.
func (r *avroReader) read(s avro.Schema) any {
	if r.err != nil {
		return nil
	}
	switch s := s.(type) {
	case *avro.RefSchema:
		return r.read(s.Schema())
	case *avro.RecordSchema:
		obj := make(map[string]any, len(s.Fields()))
		for _, f := range s.Fields() {
			obj[f.Name()] = r.read(f.Type())
		}
		return obj
	case *avro.UnionSchema:
		i := r.long()
		if i < 0 || int(i) >= len(s.Types()) {
			r.fail(fmt.Errorf("avro: union branch %d of %d", i, len(s.Types())))
			return nil
		}
		return r.read(s.Types()[i])
	case *avro.EnumSchema:
		sym, ok := s.Symbol(int(r.long()))
		if !ok {
			r.fail(fmt.Errorf("avro: no such symbol of enum %s", s.FullName()))
		}
		return sym
	case *avro.ArraySchema:
		arr := []any{}
		r.blocks(func() { arr = append(arr, r.read(s.Items())) })
		return arr
	case *avro.MapSchema:
		obj := map[string]any{}
		r.blocks(func() {
			k := string(r.next(int(r.long())))
			obj[k] = r.read(s.Values())
		})
		return obj
	case *avro.FixedSchema:
		return bytesJSON(r.next(s.Size()), s.Logical())
	case *avro.NullSchema:
		return nil
	case *avro.PrimitiveSchema:
		switch s.Type() {
		case avro.Boolean:
			b := r.next(1)
			return len(b) == 1 && b[0] != 0
		case avro.Int, avro.Long:
			return json.Number(strconv.FormatInt(r.long(), 10))
		case avro.Float:
			b := r.next(4)
			if b == nil {
				return nil
			}
			return floatJSON(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))), 32)
		case avro.Double:
			b := r.next(8)
			if b == nil {
				return nil
			}
			return floatJSON(math.Float64frombits(binary.LittleEndian.Uint64(b)), 64)
		case avro.String:
			return string(r.next(int(r.long())))
		case avro.Bytes:
			return bytesJSON(r.next(int(r.long())), s.Logical())
		}
	}
	r.fail(fmt.Errorf("avro: unsupported type %s", s.Type()))
	return nil
}

func floatJSON(f float64, bits int) any {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return strconv.FormatFloat(f, 'g', -1, bits) // JSON has no such numbers
	}
	return json.Number(strconv.FormatFloat(f, 'g', -1, bits))
}

func (r *avroReader) blocks(item func()) {
	for r.err == nil {
		n := r.long()
		if n == 0 {
			return
		}
		if n < 0 { // a block with its size in bytes
			n = -n
			r.long()
		}
		if n > int64(len(r.b)) { // every item takes at least a byte, but null: bound the loop
			n = min(n, int64(len(r.b))+1)
		}
		for range n {
			item()
		}
	}
}

func bytesJSON(b []byte, l avro.LogicalSchema) any {
	if d, ok := l.(*avro.DecimalLogicalSchema); ok && d != nil {
		return new(big.Rat).SetFrac(fromTwosComplement(b), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale())), nil)).FloatString(d.Scale())
	}
	return base64.StdEncoding.EncodeToString(b)
}
