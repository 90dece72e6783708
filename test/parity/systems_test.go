package parity

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/test/harness"
)

// converterSetup is one key/value converter configuration Debezium users
// run, and the outboxd options that match it byte for byte where outboxd
// can.
type converterSetup struct {
	name string
	// connector: Debezium connector properties (converters).
	connector map[string]string
	// smt: extra EventRouter options for every table, pasted into both
	// systems' configurations.
	smt map[string]string
	// keyFormat and valueFormat: outboxd's key.format and value.format
	// under tables:, per table.
	keyFormat, valueFormat string
	// outboxd: top-level keys of outboxd's configuration file.
	outboxd map[string]any
}

const (
	stringConverter = "org.apache.kafka.connect.storage.StringConverter"
	jsonConverter   = "org.apache.kafka.connect.json.JsonConverter"
)

var setups = []converterSetup{
	{name: "string", connector: map[string]string{"key.converter": stringConverter, "value.converter": stringConverter}, keyFormat: "raw"},
	{name: "json", connector: map[string]string{
		"key.converter": jsonConverter, "key.converter.schemas.enable": "false",
		"value.converter": jsonConverter, "value.converter.schemas.enable": "false",
	}, keyFormat: "json-string", valueFormat: "json-string"},
	{name: "json+expand", connector: map[string]string{
		"key.converter": jsonConverter, "key.converter.schemas.enable": "false",
		"value.converter": jsonConverter, "value.converter.schemas.enable": "false",
		// Some payloads make the expanded value unconvertible
		// (DataException): with Connect's default errors.tolerance=none
		// the task dies; with all, Connect skips those records.
		"errors.tolerance": "all", "errors.log.enable": "true", "errors.log.include.messages": "true",
	}, smt: map[string]string{"table.expand.json.payload": "true"}, keyFormat: "json-string", valueFormat: "json-string",
		// What Debezium cannot convert, outboxd dead-letters (to
		// outboxd.deadletter, which the comparison does not read).
		outboxd: map[string]any{"on-invalid": "dead-letter"}},
	{name: "json+expand+nulls", connector: map[string]string{
		"key.converter": jsonConverter, "key.converter.schemas.enable": "false",
		"value.converter": jsonConverter, "value.converter.schemas.enable": "false",
		"errors.tolerance": "all", "errors.log.enable": "true", "errors.log.include.messages": "true",
	}, smt: map[string]string{"table.expand.json.payload": "true", "table.json.payload.null.behavior": "optional_bytes"},
		keyFormat: "json-string", valueFormat: "json-string", outboxd: map[string]any{"on-invalid": "dead-letter"}},
	// The schema version column versions the envelope's Connect schema,
	// which JsonConverter without schemas does not write: the records are
	// the json setup's.
	{name: "json+version", connector: map[string]string{
		"key.converter": jsonConverter, "key.converter.schemas.enable": "false",
		"value.converter": jsonConverter, "value.converter.schemas.enable": "false",
	}, smt: map[string]string{"table.field.event.schema.version": "schema_version"}, keyFormat: "json-string", valueFormat: "json-string"},
	// With schemas.enable=true JsonConverter writes the value's Connect
	// schema beside it, where the schema version shows; outboxd has no
	// such value format (value.format json-string is the closest).
	{name: "json+schemas+version", connector: map[string]string{
		"key.converter": jsonConverter, "key.converter.schemas.enable": "false",
		"value.converter": jsonConverter, "value.converter.schemas.enable": "true",
	}, smt: map[string]string{"table.field.event.schema.version": "schema_version"}, keyFormat: "json-string", valueFormat: "json-string"},
}

// deadLetters: outboxd runs the named setup with --on-invalid dead-letter.
func deadLetters(setup string) bool {
	for _, s := range setups {
		if s.name == setup {
			return s.outboxd["on-invalid"] == "dead-letter"
		}
	}
	return false
}

// debeziumConnector is the connector configuration: one EventRouter per
// table, selected by a TopicNameMatches predicate on the table's change
// topic (topic.prefix "dbz"), as a Debezium user with several outbox
// layouts configures it.
func debeziumConnector(s converterSetup) map[string]string {
	p := map[string]string{}
	for k, v := range s.connector {
		p[k] = v
	}
	// outboxd's heartbeat (pg_logical_emit_message, prefix
	// outboxd.heartbeat) is in the WAL Debezium reads: without this,
	// Debezium publishes it to dbz.message.
	p["message.prefix.exclude.list"] = `outboxd\.heartbeat`
	var transforms, predicates []string
	for i, t := range corpusTables {
		tr, pr := fmt.Sprintf("outbox%d", i), fmt.Sprintf("is%d", i)
		transforms, predicates = append(transforms, tr), append(predicates, pr)
		p["transforms."+tr+".type"] = "io.debezium.transforms.outbox.EventRouter"
		p["transforms."+tr+".predicate"] = pr
		for k, v := range t.opts {
			p["transforms."+tr+"."+k] = v
		}
		for k, v := range s.smt {
			p["transforms."+tr+"."+k] = v
		}
		p["predicates."+pr+".type"] = "org.apache.kafka.connect.transforms.predicates.TopicNameMatches"
		p["predicates."+pr+".pattern"] = strings.ReplaceAll("dbz."+t.name, ".", `\.`)
	}
	p["transforms"] = strings.Join(transforms, ",")
	p["predicates"] = strings.Join(predicates, ",")
	return p
}

// outboxdConfig is outboxd's YAML: the same router options, per table under
// tables:, plus key.format per table.
func outboxdConfig(s converterSetup) ([]byte, error) {
	tables := map[string]map[string]string{}
	for _, t := range corpusTables {
		o := map[string]string{"key.format": s.keyFormat}
		if s.valueFormat != "" {
			o["value.format"] = s.valueFormat
		}
		for k, v := range t.opts {
			o[k] = v
		}
		for k, v := range s.smt {
			o[k] = v
		}
		tables[t.name] = o
	}
	file := map[string]any{"tables": tables}
	for k, v := range s.outboxd {
		file[k] = v
	}
	return yaml.Marshal(file)
}

// env is what every run shares: one PostgreSQL database holding the corpus.
type env struct {
	pg     *harness.Postgres
	dsn    string
	bin    string
	corpus *corpus
	endLSN uint64
}

func startOutboxd(t *testing.T, ctx context.Context, e *env, brokers []string, slot, publication string, config []byte, extra ...string) *harness.Proc {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(cfg, config, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := harness.StartProc(ctx, "outboxd", e.bin, append([]string{"run", "--postgres", e.dsn, "--slot", slot,
		"--publication", publication, "--kafka-brokers", strings.Join(brokers, ","), "--http-addr", addr,
		"--config", cfg}, extra...), nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Kill()
		if t.Failed() {
			t.Logf("outboxd log tail (%s):\n%s", p.LogPath(), tail(p.Log(), 6000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// waitSlot polls pg_replication_slots until cond holds for slot.
func waitSlot(ctx context.Context, dsn, slot string, what string, cond func(harness.SlotState) bool) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var last harness.SlotState
	for {
		s, err := harness.SlotInfo(ctx, conn, slot)
		if err == nil && cond(s) {
			return nil
		}
		last = s
		select {
		case <-ctx.Done():
			return fmt.Errorf("slot %s: waiting for %s: %w (last %+v)", slot, what, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// readCluster reads every record of every non-internal topic, to the end
// offsets as they are now.
func readCluster(ctx context.Context, k *harness.ApacheKafka) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range topics.Names() {
		// outboxd's own progress and checkpoint topics carry no events.
		if !strings.HasPrefix(n, "outboxd.") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, nil
	}
	ends, err := adm.ListEndOffsets(ctx, names...)
	if err != nil {
		return nil, err
	}
	starts, err := adm.ListStartOffsets(ctx, names...)
	if err != nil {
		return nil, err
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	starts.Each(func(o kadm.ListedOffset) { n -= o.Offset })
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	recs, err := harness.ReadAll(rctx, k.Brokers(), names, int(n))
	if err != nil {
		got := map[string]int64{}
		for _, r := range recs {
			got[fmt.Sprintf("%s[%d]", r.Topic, r.Partition)]++
		}
		var short []string
		ends.Each(func(o kadm.ListedOffset) {
			if p := fmt.Sprintf("%s[%d]", o.Topic, o.Partition); got[p] != o.Offset {
				short = append(short, fmt.Sprintf("%s: end offset %d, read %d", p, o.Offset, got[p]))
			}
		})
		sort.Strings(short)
		return nil, fmt.Errorf("%w (%s)", err, strings.Join(short, "; "))
	}
	if int64(len(recs)) != n {
		return nil, fmt.Errorf("read %d records, the topics hold %d", len(recs), n)
	}
	return recs, nil
}

// topicHas polls until topic holds at least n records; alive reports a
// producer that died meanwhile.
func topicHas(ctx context.Context, k *harness.ApacheKafka, topic string, n int64, alive func() error) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for {
		ends, err := adm.ListEndOffsets(ctx, topic)
		var got int64
		if err == nil {
			ends.Each(func(o kadm.ListedOffset) {
				if o.Err == nil {
					got += o.Offset
				}
			})
			if got >= n {
				return nil
			}
		}
		if err := alive(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s: %d of %d records: %w (last error %v)", topic, got, n, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// runSetup runs Debezium and outboxd for one converter setup, each on its
// own slot (created before the corpus was written) into its own cluster,
// and returns what each cluster holds once both published the corpus.
func runSetup(t *testing.T, ctx context.Context, e *env, s converterSetup, slotDbz, slotOd string) (dbz, od []*kgo.Record) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	clusters := make([]*harness.ApacheKafka, 2)
	errs := make(chan error, 2)
	for i := range clusters {
		go func() {
			c, err := harness.StartApacheKafka(ctx, 1)
			clusters[i] = c
			errs <- err
		}()
	}
	for range clusters {
		if err := <-errs; err != nil {
			for _, c := range clusters {
				if c != nil {
					c.Close()
				}
			}
			t.Fatalf("starting apache kafka: %v", err)
		}
	}
	dk, ok := clusters[0], clusters[1]
	t.Cleanup(dk.Close)
	t.Cleanup(ok.Close)
	t.Logf("two kafka clusters up in %s", time.Since(start).Round(time.Millisecond))

	cfg, err := outboxdConfig(s)
	if err != nil {
		t.Fatal(err)
	}
	startOutboxd(t, ctx, e, ok.Brokers(), slotOd, "parity", cfg)
	d := harness.DebeziumForTest(t, harness.DebeziumOptions{DSN: e.dsn, Brokers: dk.Brokers(), Slot: slotDbz,
		Publication: "parity", Connector: debeziumConnector(s)})
	t.Logf("debezium running after %s", time.Since(start).Round(time.Millisecond))

	if err := waitSlot(ctx, e.dsn, slotOd, "outboxd to confirm the corpus", func(st harness.SlotState) bool {
		return st.ConfirmedFlushLSN >= e.endLSN
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("outboxd confirmed the corpus after %s", time.Since(start).Round(time.Millisecond))
	if err := topicHas(ctx, dk, doneTopic, 1, d.Alive); err != nil {
		t.Fatalf("debezium: %v", err)
	}
	t.Logf("debezium published the corpus after %s", time.Since(start).Round(time.Millisecond))
	if dbz, err = readCluster(ctx, dk); err != nil {
		t.Fatalf("reading debezium's cluster: %v", err)
	}
	if od, err = readCluster(ctx, ok); err != nil {
		t.Fatalf("reading outboxd's cluster: %v", err)
	}
	return dbz, od
}
