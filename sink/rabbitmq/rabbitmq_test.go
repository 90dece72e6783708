package rabbitmq

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/test/harness"
)

// node is the package's one RabbitMQ node (a boot takes seconds); tests use
// exchanges and queues of their own. Its max_message_size is lowered so the
// size test does not need 128 MiB bodies.
var node *harness.RabbitMQ

const serverMaxMessage = 1 << 20

func TestMain(m *testing.M) {
	if _, err := os.Stat(harness.RabbitMQServer); err != nil && testing.Short() {
		os.Exit(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var err error
	node, err = harness.StartRabbitMQ(ctx, "max_message_size = "+strconv.Itoa(serverMaxMessage))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting rabbitmq:", err)
		os.Exit(1)
	}
	code := m.Run()
	node.Close()
	os.Exit(code)
}

// bind declares a durable queue bound to exchange for key. The queue is
// deleted first: a test starts from an empty queue of its own settings,
// also when it runs again on the same node (go test -count).
func bind(t *testing.T, ch *amqp.Channel, exchange, queue, key string, args amqp.Table) {
	t.Helper()
	deleteQueues(t, ch, queue)
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
}

// deleteQueues deletes queues an earlier run of a test left (go test
// -count), so that the test starts without them.
func deleteQueues(t *testing.T, ch *amqp.Channel, queues ...string) {
	t.Helper()
	for _, q := range queues { // RabbitMQ deletes a missing queue without complaint
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Fatal(err)
		}
	}
}

// drain takes every message of queue (n expected at least), in queue order.
func drain(t *testing.T, ch *amqp.Channel, queue string, n int) []amqp.Delivery {
	t.Helper()
	var got []amqp.Delivery
	deadline := time.Now().Add(time.Minute)
	for len(got) < n || n == 0 {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if len(got) >= n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("queue %s: %d messages, want at least %d", queue, len(got), n)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		got = append(got, d)
	}
	for { // and whatever follows (duplicates)
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return got
		}
		got = append(got, d)
	}
}

func newSink(t *testing.T, cfg Config) *Sink {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = node.URL()
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func record(topic, key, id string, value []byte) *router.Record {
	return &router.Record{Topic: topic, Key: []byte(key), Value: value, Partition: -1,
		Headers:   []router.Header{{Key: "id", Value: []byte(id)}, {Key: "type", Value: []byte("Created")}},
		Timestamp: time.Unix(1700000000, 0)}
}

// results collects callbacks by index.
type results struct {
	mu   sync.Mutex
	errs map[int]error
	n    atomic.Int64
}

func (r *results) cb(i int) func(error) {
	return func(err error) {
		r.mu.Lock()
		if r.errs == nil {
			r.errs = map[int]error{}
		}
		if _, dup := r.errs[i]; dup {
			panic(fmt.Sprintf("callback %d ran twice", i))
		}
		r.errs[i] = err
		r.mu.Unlock()
		r.n.Add(1)
	}
}

func (r *results) wait(t *testing.T, n int) map[int]error {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for r.n.Load() < int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d callbacks after 2 minutes", r.n.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs
}

// confirmedAndQueued waits for n callbacks, each nil, and returns the n
// messages of queue.
func confirmedAndQueued(t *testing.T, res *results, ch *amqp.Channel, queue string, n int) []amqp.Delivery {
	t.Helper()
	for i, err := range res.wait(t, n) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	got := drain(t, ch, queue, n)
	if len(got) != n {
		t.Fatalf("queue holds %d messages, want %d", len(got), n)
	}
	return got
}

// TestPublishConfirmed: every record is confirmed once, and the queue holds
// exactly them, in order, with the properties and headers outboxd promises.
func TestPublishConfirmed(t *testing.T) {
	ch := node.Channel(t)
	bind(t, ch, "t-publish", "q-publish", "outbox.event.#", nil)
	s := newSink(t, Config{Exchange: "t-publish", Declare: true, Window: 64})
	const n = 2000
	var res results
	for i := range n {
		s.Produce(context.Background(), record("outbox.event.Order", "order-"+strconv.Itoa(i%7), "id-"+strconv.Itoa(i), []byte(`{"n":`+strconv.Itoa(i)+`}`)), res.cb(i))
	}
	got := confirmedAndQueued(t, &res, ch, "q-publish", n)
	for i, d := range got {
		want := `{"n":` + strconv.Itoa(i) + `}`
		if string(d.Body) != want || d.MessageId != "id-"+strconv.Itoa(i) {
			t.Fatalf("message %d: id %q body %q, want id-%d %s", i, d.MessageId, d.Body, i, want)
		}
		if d.Type != "Created" || d.DeliveryMode != amqp.Persistent || d.RoutingKey != "outbox.event.Order" || d.Exchange != "t-publish" {
			t.Fatalf("message %d: type %q mode %d routing key %q exchange %q", i, d.Type, d.DeliveryMode, d.RoutingKey, d.Exchange)
		}
		if d.Headers["id"] != "id-"+strconv.Itoa(i) || d.Headers["type"] != "Created" || d.Headers[KeyHeader] != "order-"+strconv.Itoa(i%7) {
			t.Fatalf("message %d: headers %v", i, d.Headers)
		}
		if !d.Timestamp.Equal(time.Unix(1700000000, 0)) {
			t.Fatalf("message %d: timestamp %v", i, d.Timestamp)
		}
	}
}

// TestKeyInRoutingKey: with the key in the routing key a binding selects
// one aggregate.
func TestKeyInRoutingKey(t *testing.T) {
	ch := node.Channel(t)
	bind(t, ch, "t-key", "q-key", "outbox.event.Order.a-1", nil)
	if err := ch.QueueBind("q-key", "outbox.event.Order.a-1", "t-key", false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q-key-all", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("q-key-all", "outbox.event.Order.*", "t-key", false, nil); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, Config{Exchange: "t-key", KeyInRoutingKey: true})
	var res results
	for i, key := range []string{"a-1", "b-2", "a-1"} {
		s.Produce(context.Background(), record("outbox.event.Order", key, "k"+strconv.Itoa(i), nil), res.cb(i))
	}
	for i, err := range res.wait(t, 3) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if got := drain(t, ch, "q-key", 2); len(got) != 2 || got[0].MessageId != "k0" || got[1].MessageId != "k2" {
		t.Fatalf("aggregate queue: %d messages", len(got))
	}
	if got := drain(t, ch, "q-key-all", 3); len(got) != 3 {
		t.Fatalf("type queue: %d messages, want 3", len(got))
	}
}

// TestUnroutableRejected: a message no queue is bound for comes back as a
// Rejected record, not a confirmed one; the returns are matched to their own
// records, also when the same event is published twice around a routable one.
func TestUnroutableRejected(t *testing.T) {
	ch := node.Channel(t)
	bind(t, ch, "t-return", "q-return", "outbox.event.Order", nil)
	s := newSink(t, Config{Exchange: "t-return"})
	recs := []*router.Record{
		record("outbox.event.Nobody", "a", "x1", []byte("1")),
		record("outbox.event.Order", "a", "x2", []byte("2")),
		record("outbox.event.Nobody", "a", "x1", []byte("1")), // a replay of the first
		record("outbox.event.Order", "a", "x3", []byte("3")),
		record("outbox.event.Nobody", "a", "x4", []byte("4")),
	}
	var res results
	for i, r := range recs {
		s.Produce(context.Background(), r, res.cb(i))
	}
	errs := res.wait(t, len(recs))
	for i, r := range recs {
		err := errs[i]
		if r.Topic == "outbox.event.Nobody" {
			if sink.KindOf(err) != sink.Rejected || err == nil || !strings.Contains(err.Error(), "unroutable") {
				t.Fatalf("record %d (unroutable): %v, want a Rejected unroutable error", i, err)
			}
		} else if err != nil {
			t.Fatalf("record %d (routed): %v", i, err)
		}
	}
	if got := drain(t, ch, "q-return", 2); len(got) != 2 || string(got[0].Body) != "2" || string(got[1].Body) != "3" {
		t.Fatalf("queue: %d messages", len(got))
	}
}

// TestNackRejected: a queue that refuses the message (full, with
// x-overflow reject-publish) nacks it: a Rejected record.
func TestNackRejected(t *testing.T) {
	ch := node.Channel(t)
	bind(t, ch, "t-nack", "q-nack", "outbox.event.Order", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	s := newSink(t, Config{Exchange: "t-nack"})
	var res results
	ctx := context.Background()
	s.Produce(ctx, record("outbox.event.Order", "a", "n1", []byte("1")), res.cb(0))
	res.wait(t, 1)
	s.Produce(ctx, record("outbox.event.Order", "a", "n2", []byte("2")), res.cb(1))
	errs := res.wait(t, 2)
	if errs[0] != nil {
		t.Fatalf("first: %v", errs[0])
	}
	if sink.KindOf(errs[1]) != sink.Rejected || errs[1] == nil || !strings.Contains(errs[1].Error(), "basic.nack") {
		t.Fatalf("second: %v, want a Rejected nack", errs[1])
	}
}

// TestTooLarge: Check refuses a body above the configured max_message_size;
// one the server refuses anyway (the sink was told a larger limit) fails
// Rejected, the records around it are confirmed, and Check learns the limit.
func TestTooLarge(t *testing.T) {
	ch := node.Channel(t)
	bind(t, ch, "t-large", "q-large", "#", nil)
	s := newSink(t, Config{Exchange: "t-large", MaxMessageBytes: 4 * serverMaxMessage})
	big := record("outbox.event.Order", "a", "big", make([]byte, 2*serverMaxMessage))
	if err := s.Check(context.Background(), record("o", "a", "huge", make([]byte, 4*serverMaxMessage+1))); sink.KindOf(err) != sink.Rejected || err == nil {
		t.Fatalf("Check of a body above the limit: %v", err)
	}
	if err := s.Check(context.Background(), big); err != nil {
		t.Fatalf("Check before the server said its limit: %v", err)
	}
	var res results
	s.Produce(context.Background(), record("outbox.event.Order", "a", "before", []byte("b")), res.cb(0))
	s.Produce(context.Background(), big, res.cb(1))
	s.Produce(context.Background(), record("outbox.event.Order", "a", "after", []byte("a")), res.cb(2))
	errs := res.wait(t, 3)
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("around the large one: %v, %v", errs[0], errs[2])
	}
	if sink.KindOf(errs[1]) != sink.Rejected || errs[1] == nil || !strings.Contains(errs[1].Error(), strconv.Itoa(serverMaxMessage)) {
		t.Fatalf("large one: %v, want Rejected naming the server's limit %d", errs[1], serverMaxMessage)
	}
	if err := s.Check(context.Background(), big); sink.KindOf(err) != sink.Rejected || err == nil {
		t.Fatalf("Check after the server said its limit: %v", err)
	}
	got := drain(t, ch, "q-large", 2)
	var ids []string
	for _, d := range got {
		ids = append(ids, d.MessageId)
	}
	// before may repeat: it was unconfirmed when the channel closed, and is
	// republished on every channel the sink opens until its confirm.
	if n := len(ids); n < 2 || ids[n-1] != "after" || strings.Repeat("before,", n-1) != strings.Join(ids[:n-1], ",")+"," {
		t.Fatalf("queue: %v, want before (once or more), then after once", ids)
	}
}

// TestMissingExchange: without Declare a missing exchange holds: Ping says
// why, nothing fails, and once the exchange exists the records go through.
func TestMissingExchange(t *testing.T) {
	// Names of their own: the server outlives a run (-count=3).
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	exchange, queue := "t-missing-"+id, "q-missing-"+id
	s, err := New(Config{URL: node.URL(), Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Ping names the missing exchange once the connection has seen it;
	// before that (a loaded machine takes longer than any fixed span to get
	// there) it says the connection is not up: poll until it says why.
	missing := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), `exchange "`+exchange+`" does not exist`)
	}
	for deadline := time.Now().Add(30 * time.Second); !missing(err) && time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err = s.Ping(ctx)
		cancel()
		if err == nil {
			break
		}
	}
	if !missing(err) {
		t.Fatalf("Ping with the exchange missing: %v", err)
	}
	var res results
	s.Produce(context.Background(), record("outbox.event.Order", "a", "m1", []byte("1")), res.cb(0))
	ch := node.Channel(t)
	bind(t, ch, exchange, queue, "#", nil)
	if errs := res.wait(t, 1); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got := drain(t, ch, queue, 1); len(got) != 1 {
		t.Fatalf("queue: %d messages", len(got))
	}
}

// TestProgressStore: the queue keeps exactly the last record written, and
// reading it leaves it there.
func TestProgressStore(t *testing.T) {
	deleteQueues(t, node.Channel(t), "outboxd.progress.slot-a", "outboxd.progress.slot-b") // an earlier run's (go test -count)
	p := NewProgressStore(Config{URL: node.URL()}, "outboxd.progress", "slot-a")
	defer p.Close()
	ctx := context.Background()
	if err := p.EnsureProgressTopic(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.EnsureProgressTopic(ctx); err != nil {
		t.Fatalf("second declare: %v", err)
	}
	if v, err := p.LoadProgress(ctx); err != nil || v != nil {
		t.Fatalf("empty store: %q, %v", v, err)
	}
	for _, v := range []string{"one", "two", "three"} {
		if err := p.WriteProgress(ctx, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if v, err := p.LoadProgress(ctx); err != nil || string(v) != "three" {
			t.Fatalf("load: %q, %v; want three", v, err)
		}
	}
	other := NewProgressStore(Config{URL: node.URL()}, "outboxd.progress", "slot-b")
	defer other.Close()
	if err := other.EnsureProgressTopic(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := other.LoadProgress(ctx); err != nil || v != nil {
		t.Fatalf("other slot: %q, %v", v, err)
	}
	if got := p.String(); got != "queue outboxd.progress.slot-a" {
		t.Fatalf("String: %q", got)
	}
}

// TestNodeKilled: the node is SIGKILLed while records are unconfirmed and
// started again. No record fails, every one reaches the queue, and the
// first occurrences are in Produce order (the unconfirmed are published
// again ahead of later records). Ping fails while the node is down.
func TestNodeKilled(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			// Seen once under make test's load: a record returned 312
			// NO_ROUTE after the restart. The queue's state and the
			// bindings say whether the queue had not recovered yet
			// (RabbitMQ restarts a queue whose recovery failed later,
			// and routes nothing to it meanwhile) or the binding was gone.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for _, args := range [][]string{{"list_queues", "name", "state", "messages", "type"}, {"list_bindings"}} {
				out, err := node.Ctl(ctx, args...)
				t.Logf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			t.Logf("rabbitmq log tail:\n%s", node.LogTail())
		}
	})
	ch := node.Channel(t)
	bind(t, ch, "t-kill", "q-kill", "#", nil) // classic: a single-node quorum queue found no leader after a SIGKILL in 3.10 (see docs/rabbitmq.md)
	s := newSink(t, Config{Exchange: "t-kill", Declare: true, Window: 256})
	const n = 6000
	var res results
	ctx := context.Background()
	for i := range n / 2 {
		s.Produce(ctx, record("outbox.event.Order", "a", strconv.Itoa(i), []byte(strconv.Itoa(i))), res.cb(i))
	}
	for res.n.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	if err := node.Kill(); err != nil {
		t.Fatal(err)
	}
	atKill := res.n.Load()
	for i := n / 2; i < n; i++ { // produced while the node is down
		s.Produce(ctx, record("outbox.event.Order", "a", strconv.Itoa(i), []byte(strconv.Itoa(i))), res.cb(i))
	}
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := s.Ping(pctx)
	cancel()
	if err == nil {
		t.Fatal("Ping succeeded with the node down")
	}
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for i, err := range res.wait(t, n) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if atKill >= n/2 {
		t.Fatalf("all %d records of the first half were confirmed before the kill: the test proved nothing", atKill)
	}
	ch = node.Channel(t) // the old connection died with the node
	got := drain(t, ch, "q-kill", n)
	seen := map[int]bool{}
	next := 0
	for _, d := range got {
		i, err := strconv.Atoi(d.MessageId)
		if err != nil {
			t.Fatal(err)
		}
		if seen[i] {
			continue
		}
		seen[i] = true
		if i != next {
			t.Fatalf("first occurrence of %d where %d was next: order broken", i, next)
		}
		next++
	}
	if next != n {
		t.Fatalf("%d distinct records in the queue, want %d", next, n)
	}
	t.Logf("confirmed at the kill: %d of %d; messages in the queue: %d (%d duplicates)", atKill, n, len(got), len(got)-n)
}

// BenchmarkProduce: confirmed publishes per second of 200-byte records to
// one durable classic queue on the loopback node (make bench territory; not
// run by make test).
func BenchmarkProduce(b *testing.B) {
	conn, err := amqp.Dial(node.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.ExchangeDeclare("t-bench", "topic", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q-bench", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if err := ch.QueueBind("q-bench", "#", "t-bench", false, nil); err != nil {
		b.Fatal(err)
	}
	for _, window := range []int{1024, 2048, 4096} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) {
			s, err := New(Config{URL: node.URL(), Exchange: "t-bench", Window: window})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			value := []byte(strings.Repeat("x", 200))
			var done atomic.Int64
			b.ResetTimer()
			for i := range b.N {
				s.Produce(context.Background(), record("outbox.event.Order", "k", strconv.Itoa(i), value), func(err error) {
					if err != nil {
						b.Error(err)
					}
					done.Add(1)
				})
			}
			for done.Load() < int64(b.N) {
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			_, _ = ch.QueuePurge("q-bench", false)
		})
	}
	_, _ = ch.QueuePurge("q-bench", false)
}

// TestCloseFailsPending: with no server, records wait; Close fails them,
// Transient, each once, and later ones at once.
func TestCloseFailsPending(t *testing.T) {
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{URL: fmt.Sprintf("amqp://guest:secret@127.0.0.1:%d/", port), DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var res results
	for i := range 3 {
		s.Produce(context.Background(), record("o", "k", strconv.Itoa(i), nil), res.cb(i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = s.Ping(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("Ping without a server: %v, want the dial error without the password", err)
	}
	if n := res.n.Load(); n != 0 {
		t.Fatalf("%d records failed before Close: they must wait for the server", n)
	}
	s.Close()
	s.Produce(context.Background(), record("o", "k", "3", nil), res.cb(3))
	for i, err := range res.wait(t, 4) {
		if sink.KindOf(err) != sink.Transient || err == nil {
			t.Fatalf("record %d: %v, want a Transient error", i, err)
		}
	}
}

func TestTooLargeReason(t *testing.T) {
	err := &closedError{what: "channel", err: &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 2097152 is larger than configured max size 1048576"}}
	if got := tooLarge(err); got != 1048576 {
		t.Fatalf("tooLarge: %d", got)
	}
	if got := tooLarge(&closedError{what: "channel", err: &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange"}}); got != 0 {
		t.Fatalf("tooLarge of a 404: %d", got)
	}
}

// TestWriteDenied: a user without write permission on the exchange gets
// its records failed Denied (the relay stops), not retried forever.
func TestWriteDenied(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{{"add_user", "nowrite", "nowrite"}, {"set_permissions", "-p", "/", "nowrite", ".*", "", ".*"}} {
		if _, err := node.Ctl(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = node.Ctl(ctx, "delete_user", "nowrite") })
	ch := node.Channel(t)
	bind(t, ch, "t-denied", "q-denied", "#", nil)
	s := newSink(t, Config{URL: "amqp://nowrite:nowrite@" + node.Addr() + "/", Exchange: "t-denied"})
	var res results
	for i := range 3 {
		s.Produce(ctx, record("outbox.event.Order", "a", strconv.Itoa(i), []byte("x")), res.cb(i))
	}
	for i, err := range res.wait(t, 3) {
		if sink.KindOf(err) != sink.Denied || err == nil || !strings.Contains(err.Error(), "ACCESS_REFUSED") {
			t.Fatalf("record %d: %v, want Denied (403 ACCESS_REFUSED)", i, err)
		}
	}
}

// TestProgressConcurrentReaders: two instances (their own connections) read
// the same record at once, again and again; neither may ever see "none"
// while the record exists. With basic.get + requeue alone, the reader that
// comes second while the first holds the message unacknowledged finds the
// queue empty.
func TestProgressConcurrentReaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	readers := make([]*ProgressStore, 3)
	for i := range readers {
		readers[i] = NewProgressStore(Config{URL: node.URL()}, "outboxd.progress", "concurrent")
		defer readers[i].Close()
	}
	if err := readers[0].EnsureProgressTopic(ctx); err != nil {
		t.Fatal(err)
	}
	if err := readers[0].WriteProgress(ctx, []byte("record")); err != nil {
		t.Fatal(err)
	}
	const rounds = 200
	var wrong atomic.Int64
	for round := range rounds {
		var wg sync.WaitGroup
		for _, r := range readers {
			wg.Go(func() {
				v, err := r.LoadProgress(ctx)
				if err != nil || string(v) != "record" {
					if wrong.Add(1) == 1 {
						t.Errorf("round %d: load %q, %v; want the record", round, v, err)
					}
				}
			})
		}
		wg.Wait()
	}
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d of %d loads did not return the record", n, rounds*len(readers))
	}
}

// callback is results' sink.Callback for record i.
type callback struct {
	r *results
	i int
}

func (c callback) Done(err error) { c.r.cb(c.i)(err) }

// TestProduceCallbackKeepsNoRecord: ProduceCallback (the relay's path)
// keeps nothing of the record it was handed: the relay reuses it once the
// call returned, and what is published is still the record as it was.
func TestProduceCallbackKeepsNoRecord(t *testing.T) {
	ch := node.Channel(t)
	bind(t, ch, "t-callback", "q-callback", "#", nil)
	s := newSink(t, Config{Exchange: "t-callback", Declare: true, Window: 8})
	const n = 200
	var res results
	var rec router.Record
	for i := range n {
		rec = *record("outbox.event.Order", "order-1", "id-"+strconv.Itoa(i), []byte(`{"n":`+strconv.Itoa(i)+`}`))
		s.ProduceCallback(context.Background(), &rec, callback{&res, i})
		rec = router.Record{Topic: "reused", Value: []byte("reused")}
	}
	got := confirmedAndQueued(t, &res, ch, "q-callback", n)
	for i, d := range got {
		if want := `{"n":` + strconv.Itoa(i) + `}`; string(d.Body) != want || d.MessageId != "id-"+strconv.Itoa(i) || d.RoutingKey != "outbox.event.Order" {
			t.Fatalf("message %d: id %q body %q routing key %q, want id-%d %s", i, d.MessageId, d.Body, d.RoutingKey, i, want)
		}
	}
}

// TestProgressQueueDeleted: a progress queue deleted between two writes is
// declared again by the second one, whose record is then in it: the queue
// is declared once per connection, not before each write, and a mandatory
// record that no queue took comes back and is written again, not dropped.
func TestProgressQueueDeleted(t *testing.T) {
	p := NewProgressStore(Config{URL: node.URL()}, "outboxd.progress", "slot-deleted")
	defer p.Close()
	ctx := context.Background()
	if err := p.EnsureProgressTopic(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteProgress(ctx, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Channel(t).QueueDelete(p.Queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteProgress(ctx, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if v, err := p.LoadProgress(ctx); err != nil || string(v) != "two" {
		t.Fatalf("after the queue was deleted: %q, %v; want two", v, err)
	}
}
