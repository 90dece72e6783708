package schema

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Protobuf: the JSON payload is read with protojson (the proto3 JSON
// mapping: field names as in the .proto or lowerCamelCase, int64 as numbers
// or strings, enums by name, bytes as base64, well-known types in their JSON
// forms) into the message, whose binary form follows the Confluent header
// and the message indexes that locate the message in its file: one 0 byte
// for the file's first message.

// protoFile compiles a registry's .proto text with its references (by
// import name) and the standard imports (google/protobuf/*.proto).
func (r *registry) protoFile(ctx context.Context, ss sr.SubjectSchema, op string) (protoreflect.FileDescriptor, error) {
	const main = "outboxd-registry-schema.proto"
	srcs := map[string]string{main: ss.Schema.Schema}
	for _, ref := range ss.References {
		rs, err := r.cl.SchemaByVersion(ctx, ref.Subject, ref.Version)
		if err != nil {
			return nil, registryErr(fmt.Sprintf("%s's reference %s (subject %s version %d)", op, ref.Name, ref.Subject, ref.Version), err)
		}
		srcs[ref.Name] = rs.Schema.Schema
	}
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(srcs)})}
	files, err := c.Compile(ctx, main)
	if err != nil {
		return nil, registryErr(op, fmt.Errorf("%w: does not compile as Protobuf: %v", errUnusable, err))
	}
	if files[0].Messages().Len() == 0 {
		return nil, registryErr(op, fmt.Errorf("%w: the .proto defines no message", errUnusable))
	}
	return files[0], nil
}

// protoMessage finds the message named name (its full name) in fd, or the
// first message without a name, with its Confluent message indexes.
func protoMessage(fd protoreflect.FileDescriptor, name string) (protoreflect.MessageDescriptor, []int, bool) {
	if name == "" {
		return fd.Messages().Get(0), []int{0}, true
	}
	var find func(ms protoreflect.MessageDescriptors, path []int) (protoreflect.MessageDescriptor, []int)
	find = func(ms protoreflect.MessageDescriptors, path []int) (protoreflect.MessageDescriptor, []int) {
		for i := range ms.Len() {
			m := ms.Get(i)
			p := append(append([]int(nil), path...), i)
			if string(m.FullName()) == name {
				return m, p
			}
			if md, mp := find(m.Messages(), p); md != nil {
				return md, mp
			}
		}
		return nil, nil
	}
	md, path := find(fd.Messages(), nil)
	return md, path, md != nil
}

// protoFieldRE finds the field a protojson error is about.
var protoFieldRE = regexp.MustCompile(`field "?([A-Za-z_][A-Za-z0-9_.]*)"?`)

// encodeProto returns the wire format of payload as message record ("":
// the file's first) of schema id.
func encodeProto(fd protoreflect.FileDescriptor, id int, record string, payload []byte) ([]byte, error) {
	md, index, ok := protoMessage(fd, record)
	if !ok {
		return nil, &mismatch{msg: "the Protobuf schema has no message " + record}
	}
	msg := dynamicpb.NewMessage(md)
	if err := protojson.Unmarshal(payload, msg); err != nil {
		m := &mismatch{msg: "does not fit Protobuf message " + string(md.FullName()), detail: err.Error()}
		if f := protoFieldRE.FindStringSubmatch(err.Error()); f != nil {
			m.path = f[1]
		}
		return nil, m
	}
	out, _ := (&sr.ConfluentHeader{}).AppendEncode(make([]byte, 0, 16+len(payload)), id, index)
	return proto.MarshalOptions{Deterministic: true}.MarshalAppend(out, msg)
}

// decodeProto reads the message indexes and the message after the header.
func decodeProto(fd protoreflect.FileDescriptor, body []byte) ([]byte, error) {
	index, rest, err := (&sr.ConfluentHeader{}).DecodeIndex(body, 64)
	if err != nil {
		return nil, err
	}
	ms := fd.Messages()
	var md protoreflect.MessageDescriptor
	for _, i := range index {
		if i < 0 || i >= ms.Len() {
			return nil, errors.New("protobuf: the message index names no message of the schema")
		}
		md = ms.Get(i)
		ms = md.Messages()
	}
	if md == nil {
		return nil, errors.New("protobuf: no message index")
	}
	msg := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(rest, msg); err != nil {
		return nil, err
	}
	out, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(msg)
	if err != nil {
		return nil, err
	}
	// protojson varies its whitespace on purpose; the Decoder's output is
	// compact, the same bytes for the same message.
	var b bytes.Buffer
	if err := json.Compact(&b, out); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
