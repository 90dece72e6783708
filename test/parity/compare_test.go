package parity

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The record fields the comparator checks.
const (
	fPublished = "published"
	fTopic     = "topic"
	fKey       = "key"
	fValue     = "value"
	fHeaders   = "headers"
	fPartition = "partition"
	fTimestamp = "timestamp"
	// fContext: Debezium's extended headers (__debezium.context.*,
	// extended.headers.enabled=true by default since 3.3), compared apart
	// from the others so the headers row shows what else differs.
	fContext = "`__debezium.context.*` headers"
	// fNeither marks a case neither system published in a setup (an
	// event Debezium's converter rejects, which outboxd dead-letters): no
	// row of its own, it joins the setups that differ, as fPublished does.
	fNeither = "neither published"
)

var fieldOrder = []string{fPublished, fTopic, fPartition, fKey, fValue, fHeaders, fContext, fTimestamp}

// differences: field → case → the setups in which Debezium's and outboxd's
// records of that case differ in that field.
type differences map[string]map[string]map[string]bool

// examples: one pair of differing values per field, case and setup (-dump).
var examples = map[string]string{}

func example(field, cs, setup string, d, o any) {
	k := field + "|" + cs + "|" + setup
	if _, ok := examples[k]; !ok {
		examples[k] = fmt.Sprintf("%-40.40q  outboxd %-40.40q", d, o)
	}
}

func (d differences) add(field, cs, setup string) {
	if d[field] == nil {
		d[field] = map[string]map[string]bool{}
	}
	if d[field][cs] == nil {
		d[field][cs] = map[string]bool{}
	}
	d[field][cs][setup] = true
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// compare matches the two systems' records by id and records every field in
// which they differ. Problems that no setting explains (a missing, extra or
// duplicated event, another per-key order, a commit time that is not before
// Debezium's processing time) are returned as failures.
func compare(c *corpus, setup string, dbz, od []*kgo.Record, diffs differences) (failures []string) {
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(setup+": "+format, args...)) }
	index := func(who string, recs []*kgo.Record) map[string]*kgo.Record {
		m := map[string]*kgo.Record{}
		for _, r := range recs {
			id, ok := header(r, "id")
			if !ok {
				fail("%s: record without an id header in %s[%d]@%d", who, r.Topic, r.Partition, r.Offset)
				continue
			}
			if _, dup := m[id]; dup {
				fail("%s: event %s twice", who, id)
			}
			m[id] = r
		}
		return m
	}
	dm, om := index("debezium", dbz), index("outboxd", od)
	want := map[string]bool{}
	for _, id := range c.expected {
		want[id] = true
		if dm[id] == nil && om[id] != nil {
			diffs.add(fPublished, c.caseOf[id], setup)
		}
		// Where Debezium cannot convert an event either (its task dies, or
		// errors.tolerance=all skips it), outboxd dead-letters it in the
		// setups that say so.
		if om[id] == nil && (dm[id] != nil || !deadLetters(setup)) {
			fail("outboxd did not publish %s (case %s)", id, c.caseOf[id])
		}
		if om[id] == nil && dm[id] == nil {
			diffs.add(fNeither, c.caseOf[id], setup)
		}
	}
	for who, m := range map[string]map[string]*kgo.Record{"debezium": dm, "outboxd": om} {
		for id := range m {
			if !want[id] {
				fail("%s published %s (case %q), which must not be published", who, id, c.caseOf[id])
			}
		}
	}
	for _, id := range c.expected {
		d, o := dm[id], om[id]
		if d == nil || o == nil {
			continue
		}
		cs := c.caseOf[id]
		if d.Topic != o.Topic {
			diffs.add(fTopic, cs, setup)
		}
		// Without a key (and no partition placement) the producer picks
		// any partition: nothing to compare.
		if d.Partition != o.Partition && o.Key != nil {
			diffs.add(fPartition, cs, setup)
			example(fPartition, cs, setup, d.Partition, o.Partition)
		}
		if !bytes.Equal(d.Key, o.Key) || (d.Key == nil) != (o.Key == nil) {
			diffs.add(fKey, cs, setup)
			example(fKey, cs, setup, bytesOrNil(d.Key), bytesOrNil(o.Key))
		}
		if !bytes.Equal(d.Value, o.Value) || (d.Value == nil) != (o.Value == nil) {
			diffs.add(fValue, cs, setup)
			example(fValue, cs, setup, bytesOrNil(d.Value), bytesOrNil(o.Value))
		}
		var dh []kgo.RecordHeader
		ctxHeaders := 0
		for _, h := range d.Headers {
			if strings.HasPrefix(h.Key, "__debezium.context.") {
				ctxHeaders++
				continue
			}
			dh = append(dh, h)
		}
		if ctxHeaders > 0 {
			diffs.add(fContext, cs, setup)
		}
		if !sameHeaders(dh, o.Headers) {
			diffs.add(fHeaders, cs, setup)
			example(fHeaders, cs, setup, headerText(dh), headerText(o.Headers))
		}
		switch {
		case c.tsCol[cs]:
			// table.field.event.timestamp: both take the column.
			if !d.Timestamp.Equal(o.Timestamp) {
				diffs.add(fTimestamp, cs, setup)
			}
		case !o.Timestamp.Before(d.Timestamp):
			// The corpus was committed before Debezium started: its
			// processing time is later than every commit time.
			fail("event %s: outboxd's timestamp %s (the commit time) is not before Debezium's %s (processing time)",
				id, o.Timestamp.Format(time.RFC3339Nano), d.Timestamp.Format(time.RFC3339Nano))
		default:
			diffs.add(fTimestamp, cs, setup)
		}
	}
	// Per-key order: the same sequence of ids per topic and key, and the
	// commit order for the order case.
	for who, recs := range map[string][]*kgo.Record{"debezium": dbz, "outboxd": od} {
		seq := map[string][]string{}
		for _, r := range recs {
			if r.Key == nil {
				continue
			}
			id, _ := header(r, "id")
			k := r.Topic + "\x00" + string(r.Key)
			seq[k] = append(seq[k], id)
		}
		for key, ids := range c.keyOrder {
			var got []string
			for k, s := range seq {
				if strings.HasPrefix(k, "outbox.event.Ordered\x00") && strings.Contains(k, key) {
					got = s
				}
			}
			if strings.Join(got, ",") != strings.Join(ids, ",") {
				fail("%s: key %s: %d events out of commit order", who, key, len(ids))
			}
		}
	}
	return failures
}

func bytesOrNil(b []byte) string {
	if b == nil {
		return "<nil>"
	}
	return string(b)
}

func headerText(hs []kgo.RecordHeader) string {
	var parts []string
	for _, h := range hs {
		parts = append(parts, h.Key+"="+string(h.Value))
	}
	return strings.Join(parts, " ")
}

func sameHeaders(a, b []kgo.RecordHeader) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

// diffRow is one row of docs/debezium.md's difference table: a field, the setups it
// differs in, the corpus cases.
type diffRow struct{ field, setups, cases string }

func (r diffRow) String() string { return "| " + r.field + " | " + r.setups + " | " + r.cases + " |" }

// rows groups the differences by field and set of setups; cases that
// differ in a field in every setup and cover every case with records say
// "all".
func (d differences) rows(c *corpus, setupNames []string) []diffRow {
	published := map[string]bool{}
	for _, id := range c.expected {
		published[c.caseOf[id]] = true
	}
	var out []diffRow
	unpublished, neither := d[fPublished], d[fNeither]
	for _, f := range fieldOrder {
		bySetups := map[string][]string{}
		for cs, ss := range d[f] {
			var names []string
			for _, s := range setupNames {
				// A setup in which Debezium did not publish the case has
				// nothing to compare: it joins the setups that differ.
				if ss[s] || (f != fPublished && (unpublished[cs][s] || neither[cs][s])) {
					names = append(names, s)
				}
			}
			key := strings.Join(names, ", ")
			if len(names) == len(setupNames) {
				key = "all"
			}
			bySetups[key] = append(bySetups[key], cs)
		}
		keys := make([]string, 0, len(bySetups))
		for k := range bySetups {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			cases := bySetups[k]
			var ordered []string
			for _, cs := range c.cases { // corpus order
				if contains(cases, cs) {
					ordered = append(ordered, cs)
				}
			}
			text := strings.Join(ordered, ", ")
			switch n := countTrue(published); {
			case len(ordered) == n:
				text = "all"
			case len(ordered) > n/2:
				var rest []string
				for _, cs := range c.cases {
					if published[cs] && !contains(ordered, cs) {
						rest = append(rest, cs)
					}
				}
				text = "all but " + strings.Join(rest, ", ")
			}
			out = append(out, diffRow{field: f, setups: k, cases: text})
		}
	}
	return out
}

func countTrue(m map[string]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}
