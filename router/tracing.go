package router

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/wal"
)

// Debezium's tracing options (ActivateTracingSpan, which the Outbox Event
// Router runs before routing when the OpenTelemetry API is on Connect's
// classpath). outboxd needs no classpath: they are always in force.
const (
	// optSpanContext names the column holding the writer's span context,
	// serialised as java.util.Properties text (what the Quarkus outbox
	// extension writes), e.g. "traceparent=00-…-…-01".
	optSpanContext = "tracing.span.context.field"
	// optOperation is the name of outboxd's span (sink/otel) when set;
	// unset, the span is named as OpenTelemetry's messaging conventions say
	// ("send <topic>"). Debezium names its processing span after it.
	optOperation = "tracing.operation.name"
	// optContextOnly: Debezium documents false, but its outbox router sets
	// it to true when the option is absent, so only rows with a context are
	// traced. In outboxd, false makes every row of the table get a span of
	// its own (a root span when the row has no context) once tracing is on.
	optContextOnly = "tracing.with.context.field.only"

	defaultSpanContextCol = "tracingspancontext"
	defaultOperation      = "debezium-read"

	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
	// traceparentLen is a version-00 traceparent: 00-<32 hex>-<16 hex>-<2 hex>.
	traceparentLen = 55
)

// Trace is what a tracing sink (sink/otel) needs to give an event a span of
// its own. The router sets Record.Trace only with Config.Tracing, for a row
// with a span context (the tracing.span.context.field column, else a
// traceparent header from the headers column), or for every row of a table
// with tracing.with.context.field.only false.
type Trace struct {
	// Parent is the writer's span context; not valid: none, the span is a
	// root span.
	Parent     trace.SpanContext
	CommitLSN  wal.LSN
	CommitTime time.Time
	// Name is tracing.operation.name when the table sets it, else "".
	Name string
}

// tracingSettings are a table's resolved tracing options.
type tracingSettings struct {
	col     string // the span context column; "" disables
	name    string // tracing.operation.name when set explicitly
	nameSet bool
	all     bool // tracing.with.context.field.only false
}

// resolveTracing validates the tracing options of eff; set says whether a
// layer set an option.
func resolveTracing(eff Options, set func(string) bool, bad func(key, format string, args ...any)) tracingSettings {
	t := tracingSettings{col: strings.TrimSpace(eff[optSpanContext])}
	if set(optOperation) {
		if t.name = strings.TrimSpace(eff[optOperation]); t.name == "" {
			bad(optOperation, "a span name is required (or leave the option out)")
		}
		t.nameSet = true
	}
	only, err := parseBool(eff[optContextOnly])
	if err != nil {
		bad(optContextOnly, "%v", err)
	}
	t.all = !only
	return t
}

// spanContext is what a row's span context column yields: the headers
// Debezium's tracecontext propagator would inject (traceparent, and
// tracestate when the parent has one) and the parent itself.
type spanContext struct {
	present bool
	parent  trace.SpanContext
	state   string // the parent's tracestate, re-serialised
}

// parseSpanContext reads a tracing.span.context.field value. A value
// without a valid traceparent (or one java.util.Properties would refuse)
// gives no parent: Debezium then starts a new trace, and so does outboxd.
func parseSpanContext(v []byte) spanContext {
	props := parseProperties(string(v))
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(props))
	sc := trace.SpanContextFromContext(ctx)
	out := spanContext{present: true, parent: sc}
	if sc.IsValid() {
		out.state = sc.TraceState().String()
	}
	return out
}

// headers returns how many headers the context adds and their value bytes.
func (c *spanContext) headers() (n, size int) {
	if !c.present {
		return 0, 0
	}
	if c.state != "" {
		return 2, traceparentLen + len(c.state)
	}
	return 1, traceparentLen
}

// keyBytes are the header names the context adds.
func (c *spanContext) keyBytes() int {
	n, _ := c.headers()
	if n == 2 {
		return len(headerTraceparent) + len(headerTracestate)
	}
	return n * len(headerTraceparent)
}

// appendHeaders appends the traceparent (and tracestate) of a child span
// of the parent, as OpenTelemetry Java's SDK (1.68) and W3C propagator
// write them for Debezium (test/parity's TestTracingParity compares them):
// version 00, the parent's trace id, a new span id, the parent's sampled
// and random flags (the default parentbased sampler keeps the sampled one)
// and its tracestate. Without a valid parent the span is a new trace's
// root, which the default sampler samples, with flags 03: sampled, and
// W3C Trace Context level 2's "random trace id", which OpenTelemetry Java
// sets on the trace ids it generates (and outboxd's are random too).
func (c *spanContext) appendHeaders(buf []byte, hdrs []Header) ([]byte, []Header) {
	if !c.present {
		return buf, hdrs
	}
	var tid trace.TraceID
	flags := byte(trace.FlagsSampled | trace.FlagsRandom)
	if c.parent.IsValid() {
		tid = c.parent.TraceID()
		flags = byte(c.parent.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))
	} else {
		for tid == (trace.TraceID{}) {
			hi, lo := rand.Uint64(), rand.Uint64()
			for i := range 8 {
				tid[i], tid[8+i] = byte(hi>>(56-8*i)), byte(lo>>(56-8*i))
			}
		}
	}
	var sid trace.SpanID
	for sid == (trace.SpanID{}) {
		x := rand.Uint64()
		for i := range 8 {
			sid[i] = byte(x >> (56 - 8*i))
		}
	}
	start := len(buf)
	buf = append(buf, "00-"...)
	buf = hex.AppendEncode(buf, tid[:])
	buf = append(buf, '-')
	buf = hex.AppendEncode(buf, sid[:])
	buf = append(buf, '-')
	buf = hex.AppendEncode(buf, []byte{flags})
	hdrs = append(hdrs, Header{Key: headerTraceparent, Value: buf[start:len(buf):len(buf)]})
	if c.state != "" {
		start = len(buf)
		buf = append(buf, c.state...)
		hdrs = append(hdrs, Header{Key: headerTracestate, Value: buf[start:len(buf):len(buf)]})
	}
	return buf, hdrs
}

// dropTraceHeaders removes traceparent and tracestate from hdrs[from:],
// the headers column's, when the span context column gave them: one
// traceparent per record, or a consumer reading the last one (OpenTelemetry
// Java's Kafka instrumentation does) would skip the relay's span.
func dropTraceHeaders(hdrs []Header, from int) []Header {
	out := hdrs[:from]
	for _, h := range hdrs[from:] {
		if h.Key != headerTraceparent && h.Key != headerTracestate {
			out = append(out, h)
		}
	}
	return out
}

// headersParent is the span context of a traceparent (and tracestate) among
// hdrs, the headers a row's headers column gave.
func headersParent(hdrs []Header) (trace.SpanContext, bool) {
	var tp, ts string
	found := false
	for _, h := range hdrs {
		switch h.Key {
		case headerTraceparent:
			if !found {
				tp, found = string(h.Value), true
			}
		case headerTracestate:
			if ts == "" {
				ts = string(h.Value)
			}
		}
	}
	if !found {
		return trace.SpanContext{}, false
	}
	carrier := propagation.MapCarrier{headerTraceparent: tp, headerTracestate: ts}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier)), true
}

// traceFor is the Record.Trace of a routed row, or nil when the sink has
// nothing to span. hdrs are the record's headers.
func (r *Router) traceFor(t *tracingSettings, sc *spanContext, hdrs []Header, tx Tx) *Trace {
	if !r.tracing {
		return nil
	}
	var parent trace.SpanContext
	switch p, ok := headersParent(hdrs); {
	case sc.present:
		parent = sc.parent
	case ok:
		parent = p
	case !t.all:
		return nil
	}
	return &Trace{Parent: parent, CommitLSN: tx.CommitLSN, CommitTime: tx.CommitTime, Name: t.name}
}

// parseProperties reads text as java.util.Properties.load(Reader) does:
// natural lines joined by a trailing odd backslash, blank lines and lines
// whose first non-blank character is '#' or '!' skipped, the key ending at
// the first unescaped '=', ':' or blank, one '=' or ':' and the blanks
// around it skipped, the escapes \t \n \r \f \uXXXX (any other \c is c);
// the last of duplicate keys wins. A malformed \u escape, which makes Java
// throw, ends the parse with what was read before it.
func parseProperties(text string) map[string]string {
	props := map[string]string{}
	for len(text) > 0 {
		line, rest, ok := logicalLine(text)
		text = rest
		if !ok {
			break
		}
		if line == "" {
			continue
		}
		key, value, ok := splitProperty(line)
		if !ok {
			break
		}
		props[key] = value
	}
	return props
}

func isPropBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\f' }

// logicalLine returns the next logical line of text, its continuation lines
// joined with their leading blanks dropped, escapes still in place; "" for
// a blank or comment line.
func logicalLine(text string) (line, rest string, ok bool) {
	var b strings.Builder
	first := true
	for {
		i := 0
		for i < len(text) && isPropBlank(text[i]) {
			i++
		}
		if first && i < len(text) && (text[i] == '#' || text[i] == '!') {
			// A comment: to the end of its natural line, never continued.
			end := strings.IndexAny(text, "\r\n")
			if end < 0 {
				return "", "", true
			}
			return "", skipEOL(text[end:]), true
		}
		if first && (i == len(text) || text[i] == '\r' || text[i] == '\n') {
			if i == len(text) {
				return "", "", true
			}
			return "", skipEOL(text[i:]), true
		}
		text = text[i:]
		end := strings.IndexAny(text, "\r\n")
		nat := text
		if end >= 0 {
			nat, text = text[:end], skipEOL(text[end:])
		} else {
			text = ""
		}
		slashes := 0
		for j := len(nat) - 1; j >= 0 && nat[j] == '\\'; j-- {
			slashes++
		}
		if slashes%2 == 1 {
			b.WriteString(nat[:len(nat)-1])
			first = false
			if text == "" {
				return b.String(), "", true
			}
			continue
		}
		b.WriteString(nat)
		return b.String(), text, true
	}
}

func skipEOL(s string) string {
	if strings.HasPrefix(s, "\r\n") {
		return s[2:]
	}
	return s[1:]
}

// splitProperty splits a logical line into its unescaped key and value.
func splitProperty(line string) (key, value string, ok bool) {
	i := 0
	for i < len(line) {
		c := line[i]
		if c == '\\' {
			i += 2
			continue
		}
		if c == '=' || c == ':' || isPropBlank(c) {
			break
		}
		i++
	}
	if i > len(line) {
		i = len(line)
	}
	rawKey := line[:i]
	j := i
	for j < len(line) && isPropBlank(line[j]) {
		j++
	}
	if j < len(line) && (line[j] == '=' || line[j] == ':') {
		j++
		for j < len(line) && isPropBlank(line[j]) {
			j++
		}
	}
	if key, ok = unescapeProperty(rawKey); !ok {
		return "", "", false
	}
	if value, ok = unescapeProperty(line[j:]); !ok {
		return "", "", false
	}
	return key, value, true
}

func unescapeProperty(s string) (string, bool) {
	if strings.IndexByte(s, '\\') < 0 {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i == len(s) {
			break // a lone trailing backslash is dropped
		}
		switch c = s[i]; c {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+5 > len(s) {
				return "", false
			}
			var r rune
			for _, h := range []byte(s[i+1 : i+5]) {
				var d byte
				switch {
				case h >= '0' && h <= '9':
					d = h - '0'
				case h >= 'a' && h <= 'f':
					d = h - 'a' + 10
				case h >= 'A' && h <= 'F':
					d = h - 'A' + 10
				default:
					return "", false
				}
				r = r<<4 | rune(d)
			}
			b.WriteRune(r)
			i += 4
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}
