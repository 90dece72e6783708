package inbox

import (
	"encoding/base64"
	"encoding/json"
	"mime"
	"net/url"
	"strings"
)

// ceBinding is how a CloudEvents protocol binding carries the attributes
// in binary content mode (docs/cloudevents.md): a header per attribute,
// named prefix + attribute.
type ceBinding struct {
	prefix string
	// percent: values are percent-encoded (the NATS binding).
	percent bool
}

var (
	ceKafka = ceBinding{prefix: "ce_"}
	ceNATS  = ceBinding{prefix: "ce-", percent: true}
	ceAMQP  = ceBinding{prefix: "cloudEvents:"}
)

// ceStructured is the media type of the JSON event format (structured
// content mode).
const ceStructured = "application/cloudevents+json"

// readCloudEvent fills ev.CloudEvent when outboxd published ev with
// --envelope cloudevents, and then ev.ID and ev.Type where the id and type
// headers gave none. contentType is the broker's content type (Kafka's
// content-type header, NATS's Content-Type header, the AMQP property).
//
// Binary mode: the attributes are the binding's headers, the content type
// is datacontenttype. Structured mode (contentType application/cloudevents+json):
// the attributes are the JSON event's members, and ev.Value becomes its data
// (data_base64 decoded, a JSON string for a non-JSON datacontenttype
// unquoted), which is the payload binary mode and no envelope deliver, so a
// handler reads the same bytes in every mode. A structured value that is not
// a JSON object is left as it is, without attributes.
func readCloudEvent(ev *Event, b ceBinding, contentType string) {
	if mt, _, err := mime.ParseMediaType(contentType); err == nil && mt == ceStructured {
		readStructured(ev)
	} else {
		for _, h := range ev.Headers {
			if len(h.Key) <= len(b.prefix) || !strings.EqualFold(h.Key[:len(b.prefix)], b.prefix) {
				continue
			}
			v := string(h.Value)
			if b.percent {
				if u, err := url.PathUnescape(v); err == nil {
					v = u
				}
			}
			if ev.CloudEvent == nil {
				ev.CloudEvent = map[string]string{}
			}
			ev.CloudEvent[strings.ToLower(h.Key[len(b.prefix):])] = v
		}
		if ev.CloudEvent["specversion"] == "" {
			// Headers that look like attributes without the required
			// specversion are not a CloudEvent.
			ev.CloudEvent = nil
			return
		}
		if _, ok := ev.CloudEvent["datacontenttype"]; !ok && contentType != "" {
			ev.CloudEvent["datacontenttype"] = contentType
		}
	}
	if ev.CloudEvent == nil {
		return
	}
	if ev.ID == "" {
		ev.ID = ev.CloudEvent["id"]
	}
	if ev.Type == "" {
		ev.Type = ev.CloudEvent["type"]
	}
}

// readStructured parses ev.Value as the JSON event format.
func readStructured(ev *Event) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(ev.Value, &members); err != nil {
		return
	}
	attrs := make(map[string]string, len(members))
	for k, raw := range members {
		if k == "data" || k == "data_base64" {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			s = string(raw) // an extension that is a number or a boolean
		}
		attrs[k] = s
	}
	if attrs["specversion"] == "" {
		return
	}
	switch data, b64 := members["data"], members["data_base64"]; {
	case b64 != nil:
		var s string
		if json.Unmarshal(b64, &s) != nil {
			return
		}
		v, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return
		}
		ev.Value = v
	case data != nil:
		var s string
		if !isJSON(attrs["datacontenttype"]) && json.Unmarshal(data, &s) == nil {
			ev.Value = []byte(s) // a text payload, carried as a JSON string
		} else {
			ev.Value = []byte(data)
		}
	default:
		ev.Value = nil
	}
	ev.CloudEvent = attrs
}

// isJSON: datacontenttype says the data is JSON (absent means JSON, as the
// JSON event format's data member is).
func isJSON(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json") || mt == "text/json")
}

// replayCloudEvent gives a released event the attributes its headers carry
// (binary mode, whichever broker's binding parked it). Structured mode's
// attributes were in the envelope, and the parked value is its data: a
// replayed structured event has no CloudEvent.
func replayCloudEvent(ev *Event) {
	for _, b := range []ceBinding{ceKafka, ceNATS, ceAMQP} {
		if readCloudEvent(ev, b, ""); ev.CloudEvent != nil {
			return
		}
	}
}
