package kafka

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
)

// allocRecord is an event as the router makes it: key, a 300-byte payload
// and the id, type and traceparent headers.
func allocRecord() *router.Record {
	return &router.Record{Topic: "allocs", Key: []byte("agg-1"), Value: []byte(strings.Repeat("x", 300)), Partition: -1,
		Headers: []router.Header{{Key: "id", Value: []byte("e-1")}, {Key: "type", Value: []byte("Created")}, {Key: "traceparent", Value: []byte("00-1-2-01")}}}
}

// TestProduceAllocatesOncePerEvent: handing an event to the producer costs
// at most one allocation on the sink's side (the franz-go record with its
// headers and what the promise needs) and none in franz-go while it
// buffers; once records were acked, their memory serves the next ones and
// a record costs none. The record used to be built with its headers in a
// second allocation and a promise closure in a third. Manual flushing
// keeps franz-go from sending while it is measured, so the count is exact.
func TestProduceAllocatesOncePerEvent(t *testing.T) {
	s := newSink(t, newCluster(t), Config{Topics: TopicConfig{Create: true},
		Opts: []kgo.Opt{kgo.ManualFlushing(), kgo.MaxBufferedRecords(1 << 20)}})
	rec := allocRecord()
	ctx := context.Background()
	acked := make(chan error, 1)
	s.Produce(ctx, rec, func(err error) { acked <- err }) // makes the topic ready and loads its metadata
	// The record reaches the client once the topic is found: flush until
	// it is acked.
	for waiting := true; waiting; {
		if err := s.cl().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-acked:
			if err != nil {
				t.Fatal(err)
			}
			waiting = false
		case <-time.After(10 * time.Millisecond):
		}
	}
	var failed error
	done := func(err error) {
		if err != nil && failed == nil {
			failed = err
		}
	}
	flush := func() {
		t.Helper()
		if err := s.cl().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if failed != nil {
			t.Fatal(failed)
		}
	}
	if n := testing.AllocsPerRun(1000, func() { s.Produce(ctx, rec, done) }); n != 1 {
		t.Errorf("Produce: %.0f allocations per event, want 1", n)
	}
	flush() // 1,001 records acked: their memory is spare
	cb := &countCallback{}
	if n := testing.AllocsPerRun(1000, func() { s.ProduceCallback(ctx, rec, cb) }); n != 0 {
		t.Errorf("ProduceCallback after acks: %.0f allocations per event, want 0 (the acked records' memory)", n)
	}
	flush()
	if cb.n != 1001 || cb.err != nil {
		t.Fatalf("ProduceCallback: %d callbacks (err %v), want 1001", cb.n, cb.err)
	}
	// More headers than the record holds inline cost one more, no more.
	for i := range 8 {
		rec.Headers = append(rec.Headers, router.Header{Key: fmt.Sprint("h", i), Value: []byte("v")})
	}
	if n := testing.AllocsPerRun(100, func() { s.Produce(ctx, rec, done) }); n != 1 {
		t.Errorf("Produce with %d headers: %.0f allocations per event, want 1 (the headers)", len(rec.Headers), n)
	}
	if err := s.cl().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if failed != nil {
		t.Fatal(failed)
	}
}

// countCallback counts its calls and keeps the first error.
type countCallback struct {
	n   int
	err error
}

func (c *countCallback) Done(err error) {
	c.n++
	if err != nil && c.err == nil {
		c.err = err
	}
}

// BenchmarkProduce is the sink against kfake on loopback: every record
// produced and acked (allocations per event include franz-go's batching
// and kfake's share in this process).
//
//	go test -run '^$' -bench 'Produce$' -benchmem ./sink/kafka/
func BenchmarkProduce(b *testing.B) {
	s, err := New(Config{Brokers: newCluster(b).ListenAddrs(), Topics: TopicConfig{Create: true}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := allocRecord()
	if err := produceSync(s, rec); err != nil {
		b.Fatal(err)
	}
	errc := make(chan error, 1)
	done := func(err error) {
		if err != nil {
			select {
			case errc <- err:
			default:
			}
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s.Produce(ctx, rec, done)
	}
	if err := s.cl().Flush(ctx); err != nil {
		b.Fatal(err)
	}
	select {
	case err := <-errc:
		b.Fatal(err)
	default:
	}
}

// TestClientMetricsPushIsOff: franz-go pushes KIP-714 client metrics to a
// broker that asks for them, a timer and a request per interval that tell
// outboxd's operator nothing its own /metrics does not.
func TestClientMetricsPushIsOff(t *testing.T) {
	s := newSink(t, newCluster(t), Config{})
	if v, _ := s.cl().OptValue(kgo.DisableClientMetrics).(bool); !v {
		t.Error("the producer pushes client metrics (KIP-714): want kgo.DisableClientMetrics")
	}
}

// The sink keeps as many spare records as the client may buffer (the
// relay's window), not the freelist's default: an ack of a full window
// returns them all at once.
func TestSparesFollowMaxBuffered(t *testing.T) {
	s, err := New(Config{Brokers: []string{"127.0.0.1:1"}, MaxBuffered: 17000})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.spares.Max != 17000 {
		t.Fatalf("spares bound %d, want MaxBuffered (17000)", s.spares.Max)
	}
}
