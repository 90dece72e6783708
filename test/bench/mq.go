package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/test/harness"
)

// The broker columns that are not Kafka: outboxd --broker nats:// and
// --broker amqp:// on the harness's real servers (a nats-server child with
// JetStream on file storage; a private RabbitMQ node, Debian's package).
const (
	KindNATS     = "nats"
	KindRabbitMQ = "rabbitmq"
)

// OtherBrokers are the non-Kafka columns: not in the default list (each
// adds minutes to a run that takes ~18 already); -brokers names them.
var OtherBrokers = []string{KindNATS, KindRabbitMQ}

// msgBroker is what the cases need of a non-Kafka broker: where a world's
// events go and how many arrived, a consumer for the latency runs, its
// processes for the CPU split, and outboxd's flags for it. A world's
// destination is created by the bench before outboxd starts (as the
// Kafka topics are), so a consumer can attach first.
type msgBroker interface {
	desc() string
	brokerIs() string // what CPUSplit.Broker counts
	pids() []int
	restart(ctx context.Context) error
	close()
	outboxdArgs(w *world) []string
	prepare(ctx context.Context, w *world) error
	// reset empties w's destination before an outboxd drain, so that each
	// run over the same backlog starts from nothing (JetStream's duplicate
	// window would drop a second run's events: same ids).
	reset(ctx context.Context, w *world) error
	count(ctx context.Context, w *world) (int64, error)
	// consume delivers the id header and the body of every message sent to
	// w's destination, on one goroutine, until the returned stop is called.
	consume(ctx context.Context, w *world, fn func(id, body []byte)) (stop func(), err error)
}

func isMsgBroker(kind string) bool { return kind == KindNATS || kind == KindRabbitMQ }

func startMsgBroker(ctx context.Context, kind string) (msgBroker, error) {
	switch kind {
	case KindNATS:
		return startNATSBench(ctx)
	case KindRabbitMQ:
		return startRabbitBench(ctx)
	}
	return nil, fmt.Errorf("unknown broker kind %q", kind)
}

// natsBench is a nats-server; each world's topic is one stream, created
// as outboxd would create it (subjects <topic> and <topic>.>, file
// storage, R1, 2-minute duplicate window).
type natsBench struct {
	srv     *harness.NATS
	nc      *natsgo.Conn
	js      jetstream.JetStream
	version string
}

func startNATSBench(ctx context.Context) (_ *natsBench, err error) {
	b := &natsBench{}
	if b.srv, err = harness.StartNATS(ctx); err != nil {
		return nil, err
	}
	if err := b.connect(); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *natsBench) connect() (err error) {
	if b.nc != nil {
		b.nc.Close()
	}
	if b.nc, err = natsgo.Connect(b.srv.URL(), natsgo.MaxReconnects(-1)); err != nil {
		return fmt.Errorf("connecting to nats-server: %w", err)
	}
	b.version = b.nc.ConnectedServerVersion()
	b.js, err = jetstream.New(b.nc)
	return err
}

func (b *natsBench) desc() string {
	return fmt.Sprintf("nats-server %s (github.com/nats-io/nats-server/v2, built by the harness), 1 server on 127.0.0.1, JetStream file storage (sync_interval default 2m); one stream per topic, R1, 2m duplicate window", b.version)
}
func (b *natsBench) brokerIs() string { return "nats-server" }

func (b *natsBench) pids() []int {
	if pid := findProc("-c " + filepath.Join(filepath.Dir(b.srv.LogFile()), "nats.conf")); pid > 0 {
		return []int{pid}
	}
	return nil
}

func (b *natsBench) restart(ctx context.Context) error {
	_ = b.srv.Kill()
	if err := b.srv.Start(ctx); err != nil {
		return err
	}
	return b.connect()
}

func (b *natsBench) close() {
	if b.nc != nil {
		b.nc.Close()
	}
	b.srv.Close()
}

func (b *natsBench) outboxdArgs(*world) []string { return []string{"--broker", b.srv.URL()} }

func (b *natsBench) prepare(ctx context.Context, w *world) error {
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: nats.StreamName(w.topic), Subjects: []string{w.topic, w.topic + ".>"},
		Storage: jetstream.FileStorage, Replicas: 1, Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return fmt.Errorf("creating stream for %s: %w", w.topic, err)
	}
	return nil
}

func (b *natsBench) reset(ctx context.Context, w *world) error {
	if err := b.js.DeleteStream(ctx, nats.StreamName(w.topic)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("deleting stream for %s: %w", w.topic, err)
	}
	return b.prepare(ctx, w)
}

func (b *natsBench) count(ctx context.Context, w *world) (int64, error) {
	s, err := b.js.Stream(ctx, nats.StreamName(w.topic))
	if err != nil {
		return 0, err
	}
	return int64(s.CachedInfo().State.Msgs), nil
}

// consume is an ordered consumer (ephemeral, no acks, flow-controlled
// push of the whole stream from its start): the cheapest JetStream read.
func (b *natsBench) consume(ctx context.Context, w *world, fn func(id, body []byte)) (func(), error) {
	c, err := b.js.OrderedConsumer(ctx, nats.StreamName(w.topic), jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	cc, err := c.Consume(func(m jetstream.Msg) { fn([]byte(m.Headers().Get("id")), m.Data()) })
	if err != nil {
		return nil, err
	}
	return cc.Stop, nil
}

// rabbitBench is a RabbitMQ node; each world has its own durable topic
// exchange (--rabbitmq-exchange) and one durable classic queue bound to it
// for the world's topic, declared before outboxd starts so no event is
// unroutable.
type rabbitBench struct {
	node    *harness.RabbitMQ
	conn    *amqp.Connection
	ch      *amqp.Channel
	version string
}

func startRabbitBench(ctx context.Context) (_ *rabbitBench, err error) {
	b := &rabbitBench{}
	if b.node, err = harness.StartRabbitMQ(ctx); err != nil {
		return nil, err
	}
	if err := b.connect(); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *rabbitBench) connect() (err error) {
	if b.conn != nil {
		b.conn.Close()
	}
	if b.conn, err = amqp.Dial(b.node.URL()); err != nil {
		return fmt.Errorf("connecting to rabbitmq: %w", err)
	}
	if v, ok := b.conn.Properties["version"].(string); ok {
		b.version = v
	}
	b.ch, err = b.conn.Channel()
	return err
}

// channel is the bench's admin channel, reopened when a failed operation
// closed it (a channel dies with its first error).
func (b *rabbitBench) channel() (*amqp.Channel, error) {
	if b.ch != nil && !b.ch.IsClosed() {
		return b.ch, nil
	}
	if b.conn == nil || b.conn.IsClosed() {
		return nil, b.connect()
	}
	var err error
	b.ch, err = b.conn.Channel()
	return b.ch, err
}

func (b *rabbitBench) desc() string {
	return fmt.Sprintf("RabbitMQ %s (Debian's rabbitmq-server), 1 node on 127.0.0.1, no plugins; per case a durable topic exchange and one durable classic queue; persistent messages, publisher confirms", b.version)
}
func (b *rabbitBench) brokerIs() string { return "beam.smp" }

// pids is the node's Erlang VM: the beam.smp whose environment has the
// node's AMQP port (the harness passes it as RABBITMQ_NODE_PORT; the VM's
// command line does not name the node).
func (b *rabbitBench) pids() []int {
	_, port, _ := strings.Cut(b.node.Addr(), ":")
	want := []byte("\x00RABBITMQ_NODE_PORT=" + port + "\x00")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || comm(pid) != "beam.smp" {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(append([]byte{0}, env...), want) {
			return []int{pid}
		}
	}
	return nil
}

func (b *rabbitBench) restart(ctx context.Context) error {
	_ = b.node.Kill()
	if err := b.node.Start(ctx); err != nil {
		return err
	}
	return b.connect()
}

func (b *rabbitBench) close() {
	if b.conn != nil {
		b.conn.Close()
	}
	b.node.Close()
}

func rabbitExchange(w *world) string { return "bench." + w.agg }

func (b *rabbitBench) outboxdArgs(w *world) []string {
	return []string{"--broker", b.node.URL(), "--rabbitmq-exchange", rabbitExchange(w)}
}

func (b *rabbitBench) prepare(_ context.Context, w *world) error {
	ch, err := b.channel()
	if err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(rabbitExchange(w), "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring exchange %s: %w", rabbitExchange(w), err)
	}
	if _, err := ch.QueueDeclare(w.topic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring queue %s: %w", w.topic, err)
	}
	if err := ch.QueueBind(w.topic, w.topic, rabbitExchange(w), false, nil); err != nil {
		return fmt.Errorf("binding queue %s: %w", w.topic, err)
	}
	return nil
}

func (b *rabbitBench) reset(_ context.Context, w *world) error {
	ch, err := b.channel()
	if err != nil {
		return err
	}
	_, err = ch.QueuePurge(w.topic, false)
	return err
}

// count is the queue's ready messages: nothing consumes it in a drain.
func (b *rabbitBench) count(_ context.Context, w *world) (int64, error) {
	ch, err := b.channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(w.topic, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return int64(q.Messages), nil
}

// consume is a consumer with automatic acks (no prefetch limit applies)
// on its own connection, the queue's messages in its order; the id is the
// message_id property.
func (b *rabbitBench) consume(_ context.Context, w *world, fn func(id, body []byte)) (func(), error) {
	conn, err := amqp.Dial(b.node.URL())
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, err
	}
	ds, err := ch.Consume(w.topic, "bench", true, false, false, false, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range ds {
			fn([]byte(d.MessageId), d.Body)
		}
	}()
	return func() { conn.Close(); <-done }, nil
}

// comm is a process's command name (/proc/<pid>/comm).
func comm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
