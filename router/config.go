package router

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Options are Debezium Outbox Event Router option names mapped to values,
// e.g. "route.by.field": "aggregatetype".
type Options map[string]string

// Config configures a Router. The zero Config routes like Debezium's defaults
// (plus outboxd's "type" header, see below).
type Config struct {
	// Defaults apply to every table.
	Defaults Options
	// Tables are per-table overrides keyed "schema.table". A key a table
	// does not set falls back to Defaults, then to Debezium's default.
	Tables map[string]Options
	// KeyFormat is "raw" (default: the key column's bytes) or "json-string":
	// the key as Kafka's JsonConverter with schemas.enable=false writes it,
	// so that aggregates keep their partitions when cutting over from
	// Debezium: text-like columns become a JSON string ("order-1" with the
	// quotes), int2/int4/int8 columns a bare JSON number, bytea a base64
	// JSON string.
	// It is the default of the per-table option key.format (router: or
	// tables:), which wins over it.
	KeyFormat string
	// LSNHeaders adds the headers outboxd.commit_lsn ("0/16B3748"),
	// outboxd.xid (decimal) and outboxd.commit_time (RFC 3339, nanoseconds,
	// UTC) to every routed record.
	LSNHeaders bool
	// ReservedTopics are outboxd's own topics (the exactly-once checkpoint
	// topic, the progress topic, the dead-letter topic): an event routed to
	// one is invalid.
	ReservedTopics []string
	// ReservedTopicPrefixes: an event whose topic starts with one of them is
	// invalid (outboxd's default: "outboxd." and Kafka's internal "__").
	ReservedTopicPrefixes []string
	// TopicAllow, when not empty, lists the only topic prefixes events may
	// be routed to: otherwise every new routing value creates a topic (with
	// auto-creation) and a metric series.
	TopicAllow []string
	// MaxRecordBytes bounds Record.Size: a larger event is invalid, and is
	// found so from the row's sizes before the record is built (0: no bound).
	MaxRecordBytes int
	// MaxHeaders bounds a record's headers (0: DefaultMaxHeaders).
	MaxHeaders int
	// Tracing makes the router fill Record.Trace for a tracing sink
	// (sink/otel): off, records carry Debezium's tracing headers only.
	Tracing bool
	// CloudEvents configures the CloudEvents envelope (cloudevents.go).
	CloudEvents CloudEventsConfig
	// MessagePrefix, when not empty, makes transactional
	// pg_logical_emit_message messages with exactly this prefix outbox
	// events (see RouteMessage).
	MessagePrefix string
}

// Defaults returns the zero Config: Debezium's default options for every
// table, raw keys, no LSN headers, no message outbox.
func Defaults() Config { return Config{} }

// Supported option names: exactly Debezium's, plus headers.field and
// key.format.
const (
	optEventID        = "table.field.event.id"
	optEventKey       = "table.field.event.key"
	optEventPayload   = "table.field.event.payload"
	optEventTimestamp = "table.field.event.timestamp"
	optEventType      = "table.field.event.type"
	optRouteBy        = "route.by.field"
	optTopicRegex     = "route.topic.regex"
	optTopicReplace   = "route.topic.replacement"
	optTombstone      = "route.tombstone.on.empty.payload"
	optPlacement      = "table.fields.additional.placement"
	optMissing        = "table.field.additional.missing"
	// optMissingLegacy is the boolean Debezium 2.5–3.5 used for the same
	// thing; 3.6 renamed it without an alias. Accepted, so a 3.5 config
	// pastes unchanged.
	optMissingLegacy = "table.fields.additional.error.on.missing"
	optInvalidOp     = "table.op.invalid.behavior"
	optHeadersField  = "headers.field"
	// optExpand, optNullBehavior and optSchemaVersion are Debezium's
	// table.expand.json.payload, table.json.payload.null.behavior and
	// table.field.event.schema.version (expand.go, buildPlan).
	optExpand        = "table.expand.json.payload"
	optNullBehavior  = "table.json.payload.null.behavior"
	optSchemaVersion = "table.field.event.schema.version"
	// optKeyFormat is outboxd's: the key bytes, raw or json-string (see
	// Config.KeyFormat), so one table can keep Debezium's JsonConverter key
	// while another moves to raw keys.
	optKeyFormat = "key.format"
	// optValueFormat is outboxd's: raw (the payload verbatim) or
	// json-string, the payload as Kafka's JsonConverter writes Debezium's
	// STRING payload (a JSON string, NULL as null), for consumers that
	// parse that.
	optValueFormat     = "value.format"
	defaultTopicRegex  = "(?<routedByValue>.*)"
	defaultTopicRepl   = "outbox.event.${routedByValue}"
	defaultPlacement   = "type:header:type"
	defaultHeadersCol  = "headers"
	defaultsName       = "defaults"
	invalidOpWarn      = "warn"
	invalidOpError     = "error"
	invalidOpFatal     = "fatal"
	keyFormatRaw       = "raw"
	keyFormatJSONStr   = "json-string"
	maxTopicCacheItems = 1024
)

// debeziumDefaults are the defaults of every supported option. The placement
// default is outboxd's: it emits the "type" header, which Debezium ≥1.2 does
// not; set the option to "" to disable it.
var debeziumDefaults = Options{
	optEventID:        "id",
	optEventKey:       "aggregateid",
	optEventPayload:   "payload",
	optEventTimestamp: "",
	optEventType:      "type",
	optRouteBy:        "aggregatetype",
	optTopicRegex:     defaultTopicRegex,
	optTopicReplace:   defaultTopicRepl,
	optTombstone:      "false",
	optPlacement:      defaultPlacement,
	optMissing:        "error",
	optInvalidOp:      invalidOpWarn,
	optHeadersField:   defaultHeadersCol,
	optExpand:         "false",
	optNullBehavior:   nullIgnore,
	optSchemaVersion:  "",
	optKeyFormat:      keyFormatRaw,
	optValueFormat:    keyFormatRaw,
	optSpanContext:    defaultSpanContextCol,
	optOperation:      defaultOperation,
	optContextOnly:    "true", // Debezium's effective default in the outbox router (tracing.go)
	optEnvelope:       envelopeNone,
	optCEMode:         ceBinary,
	optCESource:       "",
}

type placement uint8

const (
	placeHeader placement = iota + 1
	placeEnvelope
	placePartition
)

// fieldSpec is one table.fields.additional.placement entry.
type fieldSpec struct {
	col   string
	place placement
	alias string
}

// settings are the resolved, validated options of one table (or of the
// defaults, used by every table without an entry and by messages).
type settings struct {
	name       string // "defaults" or "schema.table"
	idCol      string
	keyCol     string
	payloadCol string
	tsCol      string // "" = commit time
	routeCol   string
	headersCol string // "" = none
	topic      *topicRule
	tombstone  bool
	fields     []fieldSpec
	// implicitFields: the placement is outboxd's default "type:header:type",
	// not configured by the user, so a table without a "type" column simply
	// gets no type header instead of failing every row.
	implicitFields bool
	ignoreMissing  bool
	invalidOp      string
	jsonKey        bool         // key.format json-string
	jsonValue      bool         // value.format json-string
	expand         bool         // table.expand.json.payload (with jsonValue)
	nullAsBytes    bool         // table.json.payload.null.behavior optional_bytes
	versionCol     string       // table.field.event.schema.version; "" = none
	typeCol        string       // table.field.event.type (CloudEvents' type)
	ce             ceSettings   // envelope cloudevents (cloudevents.go)
	hdrGuard       *headerGuard // set by New
	tracing        tracingSettings
}

// resolve merges layers (later wins) over Debezium's defaults and validates
// the result. Unknown keys are reported against the layer that set them.
func resolve(name string, layers ...Options) (*settings, []error) {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s: %s", name, key, fmt.Sprintf(format, args...)))
	}
	eff := make(Options, len(debeziumDefaults))
	for k, v := range debeziumDefaults {
		eff[k] = v
	}
	placementSet := false
	set := map[string]bool{}
	for _, l := range layers {
		for _, k := range sortedKeys(l) {
			if k == optMissingLegacy {
				b, err := parseBool(l[k])
				if err != nil {
					bad(k, "%v", err)
				} else if b {
					eff[optMissing] = "error"
				} else {
					eff[optMissing] = "ignore"
				}
				continue
			}
			if _, ok := debeziumDefaults[k]; !ok {
				bad(k, "unknown option (supported: %s)", strings.Join(sortedKeys(debeziumDefaults), ", "))
				continue
			}
			eff[k] = l[k]
			set[k] = true
			if k == optPlacement {
				placementSet = true
			}
		}
	}
	s := &settings{name: name}
	column := func(key string, required bool) string {
		v := strings.TrimSpace(eff[key])
		if v == "" && required {
			bad(key, "a column name is required")
		}
		return v
	}
	var err error
	s.idCol = column(optEventID, true)
	s.keyCol = column(optEventKey, true)
	s.payloadCol = column(optEventPayload, true)
	s.tsCol = column(optEventTimestamp, false)
	s.routeCol = column(optRouteBy, true)
	s.headersCol = column(optHeadersField, false)
	s.typeCol = column(optEventType, false) // no header, as in Debezium ≥1.2; CloudEvents' type
	s.versionCol = column(optSchemaVersion, false)
	if s.expand, err = parseBool(eff[optExpand]); err != nil {
		bad(optExpand, "%v", err)
	}
	switch strings.ToLower(strings.TrimSpace(eff[optNullBehavior])) {
	case nullIgnore:
	case nullOptionalBytes:
		s.nullAsBytes = true
	default:
		bad(optNullBehavior, "%q is not one of ignore, optional_bytes", eff[optNullBehavior])
	}

	if s.tombstone, err = parseBool(eff[optTombstone]); err != nil {
		bad(optTombstone, "%v", err)
	}
	switch strings.ToLower(strings.TrimSpace(eff[optMissing])) {
	case "error":
	case "ignore":
		s.ignoreMissing = true
	default:
		bad(optMissing, "%q is not one of error, ignore", eff[optMissing])
	}
	switch v := strings.ToLower(strings.TrimSpace(eff[optInvalidOp])); v {
	case invalidOpWarn, invalidOpError, invalidOpFatal:
		s.invalidOp = v
	default:
		bad(optInvalidOp, "%q is not one of warn, error, fatal", eff[optInvalidOp])
	}
	switch v := strings.TrimSpace(eff[optKeyFormat]); v {
	case "", keyFormatRaw:
	case keyFormatJSONStr:
		s.jsonKey = true
	default:
		bad(optKeyFormat, "%q is not one of raw, json-string", eff[optKeyFormat])
	}
	switch v := strings.TrimSpace(eff[optValueFormat]); v {
	case "", keyFormatRaw:
	case keyFormatJSONStr:
		s.jsonValue = true
	default:
		bad(optValueFormat, "%q is not one of raw, json-string", eff[optValueFormat])
	}
	if s.fields, err = parsePlacement(eff[optPlacement]); err != nil {
		bad(optPlacement, "%v", err)
	}
	s.implicitFields = !placementSet
	s.ce = resolveCE(eff, s.fields, bad)
	s.tracing = resolveTracing(eff, func(k string) bool { return set[k] }, bad)
	if s.topic, err = compileTopicRule(eff[optTopicRegex], eff[optTopicReplace]); err != nil {
		var te *topicRuleError
		if errors.As(err, &te) {
			bad(te.key, "%s", te.msg)
		} else {
			bad(optTopicRegex, "%v", err)
		}
	}
	return s, errs
}

// envelope: some placement puts a column into the envelope.
func (s *settings) envelope() bool {
	for _, f := range s.fields {
		if f.place == placeEnvelope {
			return true
		}
	}
	return false
}

// parseBool accepts what Kafka's ConfigDef accepts for BOOLEAN: "true" or
// "false", any case, surrounding blanks ignored.
func parseBool(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean (true or false)", v)
}

// parsePlacement parses "col:placement[:alias],…" (Debezium's
// parseAdditionalFieldsConfig), placements header, envelope or partition.
func parsePlacement(v string) ([]fieldSpec, error) {
	var out []fieldSpec
	envelope := map[string]bool{}
	partition := ""
	for _, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.Split(entry, ":")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
			return nil, fmt.Errorf("entry %q is not column:placement[:alias]", entry)
		}
		f := fieldSpec{col: parts[0], alias: parts[0]}
		if len(parts) == 3 {
			if parts[2] == "" {
				return nil, fmt.Errorf("entry %q has an empty alias", entry)
			}
			f.alias = parts[2]
		}
		switch strings.ToLower(parts[1]) {
		case "header":
			f.place = placeHeader
		case "envelope":
			f.place = placeEnvelope
			if f.alias == "payload" {
				return nil, fmt.Errorf("entry %q: envelope alias %q clashes with the payload field", entry, f.alias)
			}
			if envelope[f.alias] {
				return nil, fmt.Errorf("entry %q: envelope field %q is placed twice", entry, f.alias)
			}
			envelope[f.alias] = true
		case "partition":
			f.place = placePartition
			if partition != "" {
				return nil, fmt.Errorf("entry %q: only one partition placement is allowed (already %q)", entry, partition)
			}
			partition = f.col
		default:
			return nil, fmt.Errorf("entry %q: unknown placement %q (header, envelope or partition)", entry, parts[1])
		}
		out = append(out, f)
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ConfigFromYAML converts the decoded "router" and "tables" sections of the
// YAML config file (trees as yaml.v3 decodes them into any) into Options.
//
// Option names may be written flat ("table.field.event.id: id") or nested
// ("table: {field: {event: {id: id}}}"); nested keys are joined with dots.
// Scalars may be strings, booleans or numbers; a list is joined with commas
// (handy for table.fields.additional.placement); an empty value is "". The
// tables section maps "schema.table" names (kept whole, never split at the
// dot) to such option trees. Writing the same option twice is an error.
// Names are not validated here; New does that.
func ConfigFromYAML(router any, tables any) (Options, map[string]Options, error) {
	defaults := Options{}
	if router != nil {
		m, ok := asMap(router)
		if !ok {
			return nil, nil, fmt.Errorf("router: expected a mapping of option names, got %T", router)
		}
		if err := flatten("router", "", m, defaults); err != nil {
			return nil, nil, err
		}
	}
	var out map[string]Options
	if tables != nil {
		m, ok := asMap(tables)
		if !ok {
			return nil, nil, fmt.Errorf("tables: expected a mapping of schema.table names, got %T", tables)
		}
		out = make(map[string]Options, len(m))
		for _, name := range sortedKeys(m) {
			opts := Options{}
			if v := m[name]; v != nil {
				tm, ok := asMap(v)
				if !ok {
					return nil, nil, fmt.Errorf("tables: %s: expected a mapping of option names, got %T", name, v)
				}
				if err := flatten("tables: "+name, "", tm, opts); err != nil {
					return nil, nil, err
				}
			}
			out[name] = opts
		}
	}
	return defaults, out, nil
}

func asMap(v any) (map[string]any, bool) {
	switch m := v.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, v := range m {
			ks, ok := scalarString(k)
			if !ok {
				return nil, false
			}
			out[ks] = v
		}
		return out, true
	case map[string]string:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out, true
	}
	return nil, false
}

func flatten(where, prefix string, m map[string]any, out Options) error {
	for _, k := range sortedKeys(m) {
		name := k
		if prefix != "" {
			name = prefix + "." + k
		}
		v := m[k]
		if sub, ok := asMap(v); ok {
			if err := flatten(where, name, sub, out); err != nil {
				return err
			}
			continue
		}
		s, ok := scalarString(v)
		if !ok {
			return fmt.Errorf("%s: %s: unsupported value of type %T", where, name, v)
		}
		if _, dup := out[name]; dup {
			return fmt.Errorf("%s: %s is set twice (flat and nested)", where, name)
		}
		out[name] = s
	}
	return nil
}

func scalarString(v any) (string, bool) {
	switch v := v.(type) {
	case nil:
		return "", true
	case string:
		return v, true
	case bool:
		return strconv.FormatBool(v), true
	case int:
		return strconv.Itoa(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1e15 {
			return strconv.FormatInt(int64(v), 10), true
		}
		return strconv.FormatFloat(v, 'g', -1, 64), true
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			s, ok := scalarString(e)
			if !ok {
				return "", false
			}
			if _, isList := e.([]any); isList {
				return "", false
			}
			parts[i] = s
		}
		return strings.Join(parts, ","), true
	}
	return "", false
}
