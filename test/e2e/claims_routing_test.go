package e2e

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"
)

// docs/debezium.md's migration claims: with --key-format json-string every key is the
// JSON string ("order-1" with quotes) and lands on the partition Kafka's
// Java client gives it (murmur2 of the key bytes, as Debezium's producer
// does), so aggregates keep their partitions across the cutover. And a
// non-transactional message with the --message-prefix is ignored (with a
// warning), not published. The broker stores the records as idempotent
// writes (a producer id on every batch).
func TestJSONStringKeyPartitionsAndNonTransactionalMessages(t *testing.T) {
	const partitions = 6
	f := newFixture(t)
	if _, err := f.admin().CreateTopic(f.ctx, partitions, 1, nil, f.topic()); err != nil {
		t.Fatal(err)
	}
	r := f.startRelay("--key-format", "json-string", "--message-prefix", "outbox")
	var evs []event
	for i := range 30 {
		evs = append(evs, event{i + 1, fmt.Sprintf("order-%d", i), "E", `{}`})
	}
	f.commit(evs...)
	msg := `{"id": "` + eventID(100) + `", "aggregatetype": "` + f.agg + `", "aggregateid": "m-1", "type": "E", "payload": {}}`
	f.exec(`SELECT pg_logical_emit_message(false, 'outbox', $1)`, msg)
	end := f.commit(event{31, "order-last", "E", `{}`})
	f.waitConfirmed(end, 20*time.Second)

	recs := f.records()
	if len(recs) != 31 {
		t.Fatalf("%d records, want the 31 rows and not the non-transactional message", len(recs))
	}
	used := map[int32]bool{}
	for _, rec := range recs {
		id, _ := header(rec, "id")
		if id == eventID(100) {
			t.Fatal("the non-transactional message was published")
		}
		if !strings.HasPrefix(string(rec.Key), `"order-`) || !strings.HasSuffix(string(rec.Key), `"`) {
			t.Fatalf("key %q is not a JSON string", rec.Key)
		}
		if want := javaPartition(rec.Key, partitions); rec.Partition != want {
			t.Fatalf("key %s on partition %d, Kafka's default partitioner puts it on %d", rec.Key, rec.Partition, want)
		}
		used[rec.Partition] = true
		// Stored as idempotent writes: a non-idempotent producer's batches
		// carry producer id -1.
		if rec.ProducerID < 0 {
			t.Fatalf("record %s stored with producer id %d: not an idempotent producer", id, rec.ProducerID)
		}
	}
	if len(used) < 4 {
		t.Fatalf("31 keys on %d of %d partitions: the check would not tell partitioners apart", len(used), partitions)
	}
	if !r.logged(f.ctx, "ignored a non-transactional message with the outbox prefix") {
		t.Fatal("no warning for the non-transactional message")
	}
}

// javaPartition is Kafka's Java default partitioner for a keyed record:
// toPositive(murmur2(key)) % partitions (org.apache.kafka.common.utils.Utils),
// written out here rather than taken from franz-go, which is under test.
func javaPartition(key []byte, partitions int) int32 {
	return int32((murmur2Java(key) & 0x7fffffff) % uint32(partitions))
}

func murmur2Java(data []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	n := len(data)
	h := uint32(seed) ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := binary.LittleEndian.Uint32(data[i:])
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	rest := data[n&^3:]
	switch len(rest) {
	case 3:
		h ^= uint32(rest[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(rest[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(rest[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// Kafka's own test vectors (UtilsTest.testMurmur2) for murmur2Java.
func TestMurmur2JavaVectors(t *testing.T) {
	for in, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := int32(murmur2Java([]byte(in))); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", in, got, want)
		}
	}
}
