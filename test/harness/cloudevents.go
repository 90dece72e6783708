package harness

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// CloudEvent is a CloudEvents 1.0 event as a consumer reads it back: its
// attributes as strings (canonical string forms) and its data.
type CloudEvent struct {
	Attrs map[string]string
	Data  []byte // binary mode: the body; structured: data (JSON as written) or data_base64 decoded
}

// BinaryCloudEvent reads a binary-mode event from a message's headers:
// attributes are the headers named prefix+name (values percent-decoded with
// percentDecoded, as the NATS binding requires), datacontenttype the
// contentType header when that is not empty.
func BinaryCloudEvent(headers map[string]string, body []byte, prefix, contentType string, percentDecoded bool) (CloudEvent, error) {
	ev := CloudEvent{Attrs: map[string]string{}, Data: body}
	for k, v := range headers {
		name, ok := strings.CutPrefix(k, prefix)
		switch {
		case contentType != "" && strings.EqualFold(k, contentType):
			ev.Attrs["datacontenttype"] = v
			continue
		case !ok:
			continue
		}
		if percentDecoded {
			// The NATS binding: values are printable ASCII, space and
			// '"' percent-encoded.
			for i := 0; i < len(v); i++ {
				if c := v[i]; c <= ' ' || c > '~' || c == '"' {
					return ev, fmt.Errorf("header %s: %q has a byte the binding requires percent-encoded (%q)", k, v, c)
				}
			}
			d, err := url.PathUnescape(v)
			if err != nil {
				return ev, fmt.Errorf("header %s: %q is not percent-encoded: %w", k, v, err)
			}
			v = d
		}
		ev.Attrs[name] = v
	}
	return ev, nil
}

// StructuredCloudEvent reads a JSON-format event (application/cloudevents+json).
func StructuredCloudEvent(value []byte) (CloudEvent, error) {
	ev := CloudEvent{Attrs: map[string]string{}}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(value, &m); err != nil {
		return ev, fmt.Errorf("not a JSON object: %w", err)
	}
	for k, v := range m {
		switch k {
		case "data":
			ev.Data = v
		case "data_base64":
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return ev, fmt.Errorf("data_base64 is not a string: %s", v)
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return ev, fmt.Errorf("data_base64: %w", err)
			}
			ev.Data = b
		default:
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return ev, fmt.Errorf("attribute %s is not a string: %s", k, v)
			}
			ev.Attrs[k] = s
		}
	}
	if _, both := m["data_base64"]; both && m["data"] != nil {
		return ev, fmt.Errorf("both data and data_base64")
	}
	return ev, nil
}

// CheckCloudEvent checks ev against the CloudEvents 1.0 core spec: id,
// source, specversion and type present and non-empty; specversion 1.0;
// source a URI reference; time an RFC 3339 timestamp; every attribute name
// lower-case a-z and 0-9 (at most 20 characters, the spec's SHOULD).
func CheckCloudEvent(ev CloudEvent) error {
	var errs []string
	for _, req := range []string{"id", "source", "specversion", "type"} {
		if ev.Attrs[req] == "" {
			errs = append(errs, "required attribute "+req+" is missing or empty")
		}
	}
	if v := ev.Attrs["specversion"]; v != "1.0" {
		errs = append(errs, fmt.Sprintf("specversion %q, want 1.0", v))
	}
	if _, err := url.Parse(ev.Attrs["source"]); err != nil {
		errs = append(errs, fmt.Sprintf("source %q is not a URI reference: %v", ev.Attrs["source"], err))
	}
	if v, ok := ev.Attrs["time"]; ok {
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			errs = append(errs, fmt.Sprintf("time %q is not RFC 3339", v))
		}
	}
	for name := range ev.Attrs {
		ok := name != "" && len(name) <= 20
		for _, c := range name {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
				ok = false
			}
		}
		if !ok {
			errs = append(errs, fmt.Sprintf("attribute name %q is not a-z0-9, at most 20 characters", name))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("not a valid CloudEvent %v: %s", ev.Attrs, strings.Join(errs, "; "))
	}
	return nil
}
