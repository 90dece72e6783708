package schema

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// Decoder is the consumer's half: it reads a Confluent wire-format value
// (outboxd's, or any Confluent-compatible serializer's) of an AVRO, JSON or
// PROTOBUF schema back into JSON, fetching each schema by the id the value carries
// once. An inbox handler calls it on Event.Payload:
//
//	dec := schema.NewDecoder(client)
//	var order Order
//	if err := dec.Decode(ctx, ev.Payload, &order); err != nil { … }
//
// Avro comes back in the natural JSON form the Encoder reads (avro.go):
// no union wrappers, bytes and fixed as base64, decimals as numeric
// strings; Protobuf in protojson's form with the .proto's field names. A
// JSON Schema value is validated against its schema on the way.
// A Decoder is safe for concurrent use.
type Decoder struct {
	reg *registry
}

// NewDecoder returns a Decoder using cl.
func NewDecoder(cl *sr.Client) *Decoder { return &Decoder{reg: newRegistry(cl, 10*time.Second)} }

// ErrNotConfluent is a value without the Confluent wire format's header.
var ErrNotConfluent = errors.New("schema: not a Confluent wire-format value (want magic byte 0 and a 4-byte schema id)")

// SchemaID returns the schema id of a Confluent wire-format value.
func SchemaID(value []byte) (int, error) {
	if len(value) < 5 || value[0] != 0 {
		return 0, ErrNotConfluent
	}
	return int(binary.BigEndian.Uint32(value[1:5])), nil
}

// DecodeJSON returns value's content as JSON.
func (d *Decoder) DecodeJSON(ctx context.Context, value []byte) ([]byte, error) {
	id, err := SchemaID(value)
	if err != nil {
		return nil, err
	}
	p, err := d.reg.byID(ctx, id)
	if err != nil {
		return nil, err
	}
	body := value[5:]
	if p.proto != nil {
		out, err := decodeProto(p.proto, body)
		if err != nil {
			return nil, fmt.Errorf("schema: value of %s: %w", p, err)
		}
		return out, nil
	}
	if p.json != nil {
		v, err := decodeJSON(body)
		if err != nil {
			return nil, fmt.Errorf("schema: value of %s is not JSON: %w", p, err)
		}
		if err := validateJSON(p.json, v); err != nil {
			return nil, fmt.Errorf("schema: value does not match %s: %w", p, err)
		}
		return body, nil
	}
	r := avroReader{b: body}
	v := r.read(p.avro)
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("avro: %d bytes after the value", len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("schema: value of %s: %w", p, r.err)
	}
	return json.Marshal(v)
}

// Decode decodes value into v as encoding/json would its JSON.
func (d *Decoder) Decode(ctx context.Context, value []byte, v any) error {
	b, err := d.DecodeJSON(ctx, value)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
