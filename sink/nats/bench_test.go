package nats_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/router"
	natssink "github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/test/harness"
)

// BenchmarkProduce is the sink alone against the real server on loopback:
// Check and Produce of b.N records (200-byte payload, id/type/trace
// headers, 100 keys), every PubAck awaited, as the relay pipelines them.
//
//	go test -run '^$' -bench Produce ./sink/nats/
func BenchmarkProduce(b *testing.B) {
	srv := harness.NATSForTest(b)
	ctx := b.Context()
	s, err := natssink.New(natssink.Config{URL: srv.URL(), CreateStreams: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	recs := make([]*router.Record, 1000)
	for i := range recs {
		recs[i] = record("bench", fmt.Sprintf("k%d", i%100), "", make([]byte, 200))
	}
	if err := s.Check(ctx, recs[0]); err != nil { // creates the stream
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		r := *recs[i%len(recs)]
		r.Headers = append([]router.Header{{Key: "id", Value: fmt.Appendf(nil, "e%d", i)}}, r.Headers[1:]...)
		if err := s.Check(ctx, &r); err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		s.Produce(ctx, &r, func(err error) {
			if err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	if failed != nil {
		b.Fatal(failed)
	}
}
