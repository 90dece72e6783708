package nats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	natssink "github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/test/harness"
)

func newSink(t *testing.T, srv *harness.NATS, cfg natssink.Config) *natssink.Sink {
	t.Helper()
	cfg.URL = srv.URL()
	s, err := natssink.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func record(topic, key, id string, value []byte) *router.Record {
	return &router.Record{Topic: topic, Key: []byte(key), Value: value, Partition: -1,
		Headers: []router.Header{{Key: "id", Value: []byte(id)}, {Key: "type", Value: []byte("OrderCreated")}, {Key: "X-Trace", Value: []byte("t-" + id)}}}
}

// publishAll checks and produces recs in order and waits for every outcome.
func publishAll(ctx context.Context, s *natssink.Sink, recs []*router.Record) []error {
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	for i, r := range recs {
		if err := s.Check(ctx, r); err != nil {
			errs[i] = err
			continue
		}
		wg.Add(1)
		s.Produce(ctx, r, func(err error) { errs[i] = err; wg.Done() })
	}
	wg.Wait()
	return errs
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// The message is the record: subject from the topic (and key token), data
// verbatim, every header by its own name, Nats-Msg-Id the event id, in
// produce order; the stream was created on the first event.
func TestPublishRoutesAndKeepsOrder(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{CreateStreams: true, KeyToken: true})
	var recs []*router.Record
	for i := range 200 {
		key := fmt.Sprintf("order-%d", i%3)
		recs = append(recs, record("outbox.event.Order", key, fmt.Sprintf("id-%03d", i), []byte(fmt.Sprintf(`{"n":%d,"raw":"\u00e9\u0000"}`, i))))
	}
	recs = append(recs, &router.Record{Topic: "outbox.event.Order", Value: []byte{0xff, 0x00, 0xfe}, Partition: -1,
		Headers: []router.Header{{Key: "id", Value: []byte("id-nokey")}}})
	for i, err := range publishAll(ctx, s, recs) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	msgs, err := harness.ReadStream(ctx, srv.URL(), "outbox_event_Order", len(recs))
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != len(recs) {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(recs))
	}
	for i, m := range msgs {
		r := recs[i]
		wantSubj := "outbox.event.Order." + string(r.Key)
		if r.Key == nil {
			wantSubj = "outbox.event.Order"
		}
		id := string(r.Headers[0].Value)
		if m.Subject != wantSubj || !bytes.Equal(m.Data, r.Value) || m.Header.Get("id") != id || m.Header.Get(jetstream.MsgIDHeader) != id {
			t.Fatalf("message %d: subject %q id %q msg-id %q data %q; want %q, %q, %q", i, m.Subject, m.Header.Get("id"), m.Header.Get(jetstream.MsgIDHeader), m.Data, wantSubj, id, r.Value)
		}
		if r.Key != nil && (m.Header.Get("type") != "OrderCreated" || m.Header.Get("X-Trace") != "t-"+id || m.Header.Get(natssink.KeyHeader) != string(r.Key)) {
			t.Fatalf("message %d headers: %v", i, m.Header)
		}
	}
}

// A replay inside the duplicate window is acked and dropped: the stream
// holds each event once.
func TestReplayIsDeduplicated(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{CreateStreams: true})
	var recs []*router.Record
	for i := range 10 {
		recs = append(recs, record("dedup", "k", fmt.Sprintf("e%d", i), []byte{byte(i)}))
	}
	for round := range 2 {
		for i, err := range publishAll(ctx, s, recs) {
			if err != nil {
				t.Fatalf("round %d record %d: %v", round, i, err)
			}
		}
	}
	st := streamState(t, ctx, srv, "dedup")
	if st.Msgs != 10 || st.LastSeq != 10 {
		t.Fatalf("stream holds %d messages (last seq %d) after a replay, want 10", st.Msgs, st.LastSeq)
	}
}

func streamState(t *testing.T, ctx context.Context, srv *harness.NATS, name string) jetstream.StreamState {
	t.Helper()
	st, err := srv.JetStream(t).Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().State
}

// What JetStream refuses for good is a Rejected event before it is sent:
// no stream (without CreateStreams), larger than the server's max_payload
// or the stream's max_msg_size, an invalid subject.
func TestCheckRejects(t *testing.T) {
	srv := harness.NATSForTest(t, harness.WithNATSConfig("max_payload: 8192"))
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{KeyToken: true})
	js := srv.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "small", Subjects: []string{"small", "small.>"}, MaxMsgSize: 1024}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		rec  *router.Record
		want string // "" accepted
	}{
		{"fits", record("small", "k", "1", make([]byte, 900)), ""},
		{"stream max_msg_size", record("small", "k", "3", make([]byte, 1024)), "max_msg_size 1024"},
		{"server max_payload", record("small", "k", "4", make([]byte, 9000)), "max_payload 8192"},
		{"wildcard key", record("small", "a*", "5", []byte("x")), ""},
		{"key with a space", record("small", "a b", "6", []byte("x")), "not a valid NATS subject"},
	} {
		err := s.Check(ctx, c.rec)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (sink.KindOf(err) != sink.Rejected || !strings.Contains(fmt.Sprint(err), c.want)):
			t.Errorf("%s: got %v (kind %v), want a rejection saying %q", c.name, err, sink.KindOf(err), c.want)
		}
	}
	// No stream: the publish is rejected (so the relay retries it alone,
	// and streams on once the stream exists).
	rec := record("nostream", "k", "2", []byte("x"))
	if err := s.Check(ctx, rec); err != nil {
		t.Fatalf("Check of a topic without a stream: %v", err)
	}
	if err := s.Probe(ctx, rec); sink.KindOf(err) != sink.Rejected || !strings.Contains(fmt.Sprint(err), "no JetStream stream captures subject nostream.k") {
		t.Fatalf("publish without a stream: %v (kind %v)", err, sink.KindOf(err))
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "nostream", Subjects: []string{"nostream.>"}}); err != nil {
		t.Fatal(err)
	}
	var err error
	for range 2 { // the first is refused by the fence the rejection raised
		err = s.Probe(ctx, rec)
	}
	if err != nil {
		t.Fatalf("publish once the stream exists: %v", err)
	}
}

// The order fence: once a publish fails, nothing published after it may be
// stored before it. A is refused by the stream (published without Check);
// B and C, already on their way, name their predecessor and are refused
// too; the stream still ends at P. The replay then stores A's successors in
// order once A is out of the way (here: dead-lettered elsewhere).
func TestFailedPublishIsNotOvertaken(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	js := srv.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ord", Subjects: []string{"ord"}, MaxMsgSize: 512}); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, srv, natssink.Config{})
	p, a := record("ord", "k", "P", []byte("p")), record("ord", "k", "A", make([]byte, 600))
	b, c := record("ord", "k", "B", []byte("b")), record("ord", "k", "C", []byte("c"))
	if errs := publishAll(ctx, s, []*router.Record{p}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	wg.Add(3)
	for i, r := range []*router.Record{a, b, c} { // pipelined, no Check: A reaches the stream
		s.Produce(ctx, r, func(err error) { errs[i] = err; wg.Done() })
	}
	wg.Wait()
	if sink.KindOf(errs[0]) != sink.Rejected {
		t.Fatalf("A: %v, want a rejection", errs[0])
	}
	for i, err := range errs[1:] {
		if err == nil || sink.KindOf(err) != sink.Transient {
			t.Fatalf("%c: %v, want a transient failure (its predecessor is missing)", 'B'+i, err)
		}
	}
	if st := streamState(t, ctx, srv, "ord"); st.Msgs != 1 {
		t.Fatalf("the stream holds %d messages, want 1 (P): a later event overtook the failed one", st.Msgs)
	}
	// The relay's next session: the fence refuses at most one more record
	// of the failed session, then lets the replay through.
	err := s.Probe(ctx, b)
	if sink.KindOf(err) != sink.Transient {
		t.Fatalf("first publish after the failure: %v, want the fence", err)
	}
	for i, err := range publishAll(ctx, s, []*router.Record{p, b, c}) {
		if err != nil {
			t.Fatalf("replay %d: %v", i, err)
		}
	}
	msgs, err := harness.ReadStream(ctx, srv.URL(), "ord", 3)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, m.Header.Get("id"))
	}
	if strings.Join(got, ",") != "P,B,C" {
		t.Fatalf("stream holds %v, want P,B,C", got)
	}
}

// A server that is down holds (Transient); publishing resumes when it is
// back, and JetStream kept what it had acked across a SIGKILL.
func TestServerDownHoldsAndKillKeepsAcked(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{CreateStreams: true})
	var recs []*router.Record
	for i := range 50 {
		recs = append(recs, record("down", "k", fmt.Sprintf("e%02d", i), []byte{byte(i)}))
	}
	for i, err := range publishAll(ctx, s, recs[:25]) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	// Bounded, as the relay's monitor bounds it (its interval): a client
	// that has not noticed the kill yet sends the request and waits for an
	// answer that never comes (under load, until the test's deadline).
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.Ping(pctx); err == nil {
		t.Fatal("Ping succeeded with the server down")
	}
	err := s.Probe(ctx, recs[25])
	if err == nil || sink.KindOf(err) != sink.Transient {
		t.Fatalf("publish with the server down: %v, want a transient error", err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The session that failed is over; the next one finds the fence and
	// starts once more (see admit), then streams.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.Probe(ctx, recs[25])
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publishing after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the client reconnects on its own clock
	}
	for i, err := range publishAll(ctx, s, recs[26:]) {
		if err != nil {
			t.Fatalf("record %d: %v", 26+i, err)
		}
	}
	msgs, err := harness.ReadStream(ctx, srv.URL(), "down", 50)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		if want := fmt.Sprintf("e%02d", i); m.Header.Get("id") != want {
			t.Fatalf("message %d is %s, want %s", i, m.Header.Get("id"), want)
		}
	}
	if len(msgs) != 50 {
		t.Fatalf("stream holds %d messages, want 50", len(msgs))
	}
}

func TestProgressStoreRoundTrip(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{})
	p := natssink.ProgressStore{Sink: s, Key: "7312345678901234567/outboxd"}
	if err := p.EnsureProgressTopic(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.EnsureProgressTopic(ctx); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	if v, err := p.LoadProgress(ctx); err != nil || v != nil {
		t.Fatalf("empty bucket: %q, %v", v, err)
	}
	for _, v := range []string{"first", `{"lsn":"0/16B3748"}`} {
		if err := p.WriteProgress(ctx, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := p.LoadProgress(ctx); err != nil || string(v) != `{"lsn":"0/16B3748"}` {
		t.Fatalf("LoadProgress: %q, %v", v, err)
	}
	if p.String() != "bucket outboxd_progress, key 7312345678901234567/outboxd" {
		t.Fatal(p.String())
	}
	_ = errors.New
}

// Topics whose stream names collide (a.b and a_b) are not silently sent
// to a stream that does not capture them: the second is rejected, saying
// why.
func TestStreamNameCollisionRejected(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{CreateStreams: true})
	if err := s.Check(ctx, record("col.x", "k", "1", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	rec := record("col_x", "k", "2", []byte("x"))
	if err := s.Check(ctx, rec); err != nil {
		t.Fatal(err)
	}
	err := s.Probe(ctx, rec)
	if sink.KindOf(err) != sink.Rejected || !strings.Contains(fmt.Sprint(err), "stream col_x exists but does not capture col_x") {
		t.Fatalf("colliding topic: %v (kind %v)", err, sink.KindOf(err))
	}
}

// callback is a sink.Callback that counts down wg and keeps the error.
type callback struct {
	wg  *sync.WaitGroup
	err *error
}

func (c callback) Done(err error) { *c.err = err; c.wg.Done() }

// TestProduceCallbackKeepsNoRecord: ProduceCallback (the relay's path)
// keeps nothing of the record it was handed: the relay reuses it once the
// call returned, and what is stored is still the record as it was.
func TestProduceCallbackKeepsNoRecord(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{CreateStreams: true})
	const n = 50
	errs := make([]error, n)
	var wg sync.WaitGroup
	var rec router.Record
	for i := range n {
		rec = *record("outbox.event.Callback", "k", fmt.Sprintf("id-%02d", i), fmt.Appendf(nil, "%d", i))
		if err := s.Check(ctx, &rec); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		s.ProduceCallback(ctx, &rec, callback{&wg, &errs[i]})
		rec = router.Record{Topic: "reused", Value: []byte("reused")}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	msgs, err := harness.ReadStream(ctx, srv.URL(), "outbox_event_Callback", n)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != n {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), n)
	}
	for i, m := range msgs {
		if id := fmt.Sprintf("id-%02d", i); m.Subject != "outbox.event.Callback" || string(m.Data) != fmt.Sprint(i) || m.Header.Get(jetstream.MsgIDHeader) != id {
			t.Fatalf("message %d: subject %q data %q msg-id %q, want %s", i, m.Subject, m.Data, m.Header.Get(jetstream.MsgIDHeader), id)
		}
	}
}
