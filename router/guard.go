package router

import (
	"bytes"
	"strconv"
	"strings"
)

// Rows and messages are untrusted input: anyone who may INSERT into an
// outbox table (or call pg_logical_emit_message, with a message prefix)
// chooses the routing value, the headers and the sizes. These checks keep
// such an event from reaching outboxd's own topics, from shadowing the
// headers consumers dedupe on, and from exhausting memory; each refusal is
// an invalid event, handled by --on-invalid like any other.

// HeaderOverhead is what Record.Size counts per header on top of its key and
// value: the Header itself and the producer's copy of it. Without it, a row
// of many tiny headers would cost far more memory than the in-flight byte
// bound says.
const HeaderOverhead = 80

// DefaultMaxHeaders bounds the headers of one record when Config.MaxHeaders
// is 0.
const DefaultMaxHeaders = 64

// ReservedHeaderPrefix starts the names of outboxd's own headers.
const ReservedHeaderPrefix = "outboxd."

// topicRefusal says why an event may not go to topic, or "".
// The topic itself goes to InvalidError.Detail: it is made of row data.
func (r *Router) topicRefusal(topic string) string {
	for _, t := range r.reservedTopics {
		if topic == t {
			return "the topic is one of outboxd's own (checkpoint, progress or dead-letter topic): an event may never be routed there"
		}
	}
	for _, p := range r.reservedPrefixes {
		if strings.HasPrefix(topic, p) {
			return "the topic starts with the reserved prefix " + strconv.Quote(p) + " (--reserved-topic-prefixes)"
		}
	}
	if len(r.allow) == 0 {
		return ""
	}
	for _, p := range r.allow {
		if strings.HasPrefix(topic, p) {
			return ""
		}
	}
	return "the topic is not under an allowed prefix (--topic-allow " + strings.Join(r.allow, ",") + ")"
}

// headerGuard decides which header names an event's headers column (or
// message member) may not use: "id", the header placements' aliases (type),
// and outboxd.*. Those are outboxd's to set; a second "id" header would
// defeat consumers that dedupe on the first or the last one.
type headerGuard struct {
	aliases []string
	max     int
}

func (g *headerGuard) reserved(key []byte) bool {
	if string(key) == "id" || bytes.HasPrefix(key, []byte(ReservedHeaderPrefix)) {
		return true
	}
	for _, a := range g.aliases {
		if string(key) == a {
			return true
		}
	}
	return false
}

func newHeaderGuard(s *settings, max int) *headerGuard {
	g := &headerGuard{max: max}
	for _, f := range s.fields {
		if f.place == placeHeader {
			g.aliases = append(g.aliases, f.alias)
		}
	}
	return g
}

const reservedHeaderReason = "a header name is reserved (outboxd itself sets id, the placement headers such as type, and outboxd.*): rename the key"

// oversizeReason is the reason of an event the stream cut short.
func oversizeReason(n int) string {
	return "the event is " + strconv.Itoa(n) + " bytes as PostgreSQL sent it, more than outboxd reads whole (--max-message-bytes); raise it or use --on-invalid dead-letter"
}

// tooLargeReason is the reason of an event whose record would exceed
// Config.MaxRecordBytes.
func tooLargeReason(size, max int) string {
	return "the record would be about " + strconv.Itoa(size) + " bytes, more than --max-message-bytes allows (" +
		strconv.Itoa(max) + " for the record); raise it (and the topic's max.message.bytes) or use --on-invalid dead-letter"
}
