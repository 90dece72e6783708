// Package rabbitmq is the RabbitMQ sink, built on amqp091-go: every record
// is published, persistent and mandatory, to one exchange on one channel in
// confirm mode, and its callback runs only when RabbitMQ has confirmed it
// (basic.ack: the message is in every queue it was routed to, on disk for
// durable queues, on a majority for quorum queues).
//
// Order. One goroutine owns the connection and publishes records in Produce
// order on a single channel; RabbitMQ keeps a channel's publishes in order
// in every queue. When the channel or the connection is lost, the records
// not yet confirmed are not failed: they go back to the front of the line,
// ahead of every later record, and are published again, in the same order,
// on the next channel (a duplicate for any that had reached their queue).
// So a lost connection holds the relay, as a Kafka outage does, and a later
// record can never reach a queue ahead of an earlier one that was lost on
// the way: the first occurrences a consumer sees are in Produce order.
//
// Refusals. A message no queue is bound for comes back (basic.return,
// because it is published mandatory) and a message a queue refuses is
// nacked (basic.nack: a queue with x-overflow reject-publish that is full,
// an internal error); both fail that record with a sink.Error of kind
// Rejected, so --on-invalid applies to it instead of the message vanishing.
// Records published behind a refused one are already on the wire and take
// their own outcome; see docs/rabbitmq.md for what that means for order.
package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// DefaultMaxMessageBytes is RabbitMQ 3.8 to 3.13's default max_message_size
// (128 MiB; RabbitMQ 4 lowered it to 16 MiB). The server does not announce
// it, so Config.MaxMessageBytes must match the server's setting for Check to
// refuse exactly what the server would.
const DefaultMaxMessageBytes = 128 << 20

// DefaultWindow is the publisher-confirm window: how many messages are on
// their way to the server, unconfirmed, at most. It bounds the duplicates
// after a crash of outboxd or of the connection (docs/rabbitmq.md), so it
// is as small as confirms allow: a persistent message's confirm waits for
// an fsync, and 2,048 covers what is published meanwhile with room to
// spare; 4,096 (the default before issue 34) drained no faster.
const DefaultWindow = 2048

// DefaultExchange is the exchange records go to unless Config.Exchange says
// otherwise.
const DefaultExchange = "outboxd"

// ErrExactlyOnce is the answer to --exactly-once on RabbitMQ.
var ErrExactlyOnce = errors.New("rabbitmq: exactly-once mode is not available: AMQP 0-9-1 has no transaction that commits messages together with a consumer-visible checkpoint (tx.commit is neither atomic across queues nor compatible with publisher confirms), so outboxd can only promise at-least-once delivery; run without --exactly-once and deduplicate on the message_id property (the event id)")

// Config configures the sink.
type Config struct {
	// URL is the AMQP URI: amqp://user:password@host:port/vhost, or amqps://
	// for TLS.
	URL string
	TLS *tls.Config // for amqps (nil: the system roots)
	// Exchange receives every record (DefaultExchange if empty).
	Exchange string
	// ExchangeType is the type used when the exchange is declared ("topic").
	ExchangeType string
	// Declare declares the exchange (durable) on every connection when it is
	// missing, as --create-topics does for Kafka. Without it a missing
	// exchange holds the relay, logged, until someone declares it.
	Declare bool
	// KeyInRoutingKey appends "." and the record's key (the aggregate id) to
	// the routing key, so bindings can select single aggregates.
	KeyInRoutingKey bool
	// MaxMessageBytes is the server's max_message_size (DefaultMaxMessageBytes
	// if 0): a larger body is refused by Check before it is published.
	MaxMessageBytes int
	// Window bounds the messages published and not yet confirmed
	// (DefaultWindow).
	Window int
	// DialTimeout bounds one connection attempt (10s).
	DialTimeout time.Duration
	Logger      *slog.Logger
	// Held, if set, hears that the exchange is missing (err) and that it
	// exists again (nil), for /readyz and /status.
	Held func(dest string, err error)
}

// Sink is a RabbitMQ publisher with confirms.
type Sink struct {
	cfg      Config
	exchange string
	log      *slog.Logger

	mu      sync.Mutex
	pending []*entry // to publish, in order (the unconfirmed of a lost channel first)
	wake    chan struct{}
	closed  bool
	up      bool  // a channel in confirm mode is open
	lastErr error // why the last connection attempt or channel failed
	upc     chan struct{}
	maxBody int // max_message_size, lowered if the server says it is lower
	frame   int // the negotiated frame_max: the properties must fit one frame

	pinging   chan error // the unanswered Ping's round trip, if any
	pingSince time.Time

	holding bool             // Config.Held was told the exchange is missing (run's)
	conn    *amqp.Connection // serve's, for Close to unblock a publish the server stopped reading

	stop chan struct{} // closed by Close
	done chan struct{} // closed when the owner goroutine returns
}

// entry is one record on its way: the record, its routing key, its
// callback and, once published on a channel, its delivery tag there.
//
// It holds the routed record, not its AMQP message: up to
// --max-inflight-events records wait here (the window on the wire is only
// a few thousand), and a message built ahead of its publish (a headers map
// and a string copy of every header) took three times the record's own
// memory. serve builds each message just before publishing it, into a
// headers table it reuses, and amqp091 has encoded it by the time Publish
// returns.
type entry struct {
	rec      router.Record // a copy: the caller may reuse its own (sink.CallbackProducer)
	key      string
	done     func(error)   // Produce's
	cb       sink.Callback // ProduceCallback's
	tag      uint64
	returned *amqp.Return
}

// finish reports the message's outcome to its caller.
func (e *entry) finish(err error) {
	if e.cb != nil {
		e.cb.Done(err)
		return
	}
	e.done(err)
}

// messageIDIs says whether id is the record's id header (its message_id),
// without a copy.
func (e *entry) messageIDIs(id string) bool {
	for _, h := range e.rec.Headers {
		if h.Key == "id" {
			return string(h.Value) == id
		}
	}
	return id == ""
}

// New builds the sink and starts its owner goroutine, which connects in the
// background: a server that is down at startup is retried like one that
// goes down later.
func New(cfg Config) (*Sink, error) {
	if cfg.URL == "" {
		return nil, errors.New("rabbitmq: no server URL (--broker amqp://user:password@host:5672/vhost)")
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("rabbitmq: bad URL: %w (want amqp://user:password@host:5672/vhost)", err)
	}
	if cfg.Exchange == "" {
		cfg.Exchange = DefaultExchange
	}
	if cfg.ExchangeType == "" {
		cfg.ExchangeType = amqp.ExchangeTopic
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sink{cfg: cfg, exchange: cfg.Exchange, log: log, wake: make(chan struct{}, 1), upc: make(chan struct{}),
		maxBody: cfg.MaxMessageBytes, stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s, nil
}

// Produce queues rec for publication; done runs once RabbitMQ confirmed it,
// or with a sink.Error of kind Rejected when it was returned or nacked.
func (s *Sink) Produce(_ context.Context, rec *router.Record, done func(error)) {
	s.queue(&entry{rec: *rec, key: s.routingKey(rec), done: done})
}

var _ sink.CallbackProducer = (*Sink)(nil)

// ProduceCallback is Produce calling cb.Done (sink.CallbackProducer): the
// relay's per-event state is the callback, no closure. The entry holds a
// copy of rec, so rec itself is not kept.
func (s *Sink) ProduceCallback(_ context.Context, rec *router.Record, cb sink.Callback) {
	s.queue(&entry{rec: *rec, key: s.routingKey(rec), cb: cb})
}

func (s *Sink) queue(e *entry) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		e.finish(&sink.Error{Kind: sink.Transient, Err: errors.New("rabbitmq: sink closed")})
		return
	}
	s.pending = append(s.pending, e)
	s.mu.Unlock()
	s.signal()
}

func (s *Sink) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// routingKey is the record's topic, with ".<key>" if configured.
func (s *Sink) routingKey(rec *router.Record) string {
	if s.cfg.KeyInRoutingKey && len(rec.Key) > 0 {
		return rec.Topic + "." + string(rec.Key)
	}
	return rec.Topic
}

// KeyHeader carries the record's key (the aggregate id): AMQP messages have
// no key of their own.
const KeyHeader = "outboxd.key"

// message converts a routed record to an AMQP message: persistent, the
// event id as message_id, the event type as type, every header as a string
// header (AMQP long strings are binary-safe). hdrs, if not nil, is cleared
// and used as the headers table: the caller's to reuse once the message is
// encoded.
func message(rec *router.Record, hdrs amqp.Table) amqp.Publishing {
	m := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: rec.Value, Timestamp: rec.Timestamp}
	if len(rec.Headers) > 0 || rec.Key != nil {
		if hdrs == nil {
			hdrs = make(amqp.Table, len(rec.Headers)+1)
		}
		clear(hdrs)
		m.Headers = hdrs
	}
	// Every value and the key become strings in one allocation; the
	// properties share the headers' strings.
	size := len(rec.Key)
	for _, h := range rec.Headers {
		size += len(h.Value)
	}
	var b strings.Builder
	b.Grow(size)
	for _, h := range rec.Headers {
		b.Write(h.Value)
	}
	b.Write(rec.Key)
	all := b.String()
	for _, h := range rec.Headers {
		v := all[:len(h.Value)]
		all = all[len(h.Value):]
		m.Headers[h.Key] = v
		switch h.Key {
		case "id":
			m.MessageId = v
		case "type":
			m.Type = v
		case ContentTypeHeader: // CloudEvents (cloudevents.go)
			m.ContentType = v
		}
	}
	if rec.Key != nil {
		m.Headers[KeyHeader] = all
	}
	return m
}

// Check says whether RabbitMQ would refuse rec: a body above
// max_message_size, properties that do not fit one frame, a routing key
// longer than AMQP's 255 bytes.
func (s *Sink) Check(_ context.Context, rec *router.Record) error {
	s.mu.Lock()
	maxBody, frame := s.maxBody, s.frame
	s.mu.Unlock()
	if len(rec.Value) > maxBody {
		return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("the message body is %d bytes, more than the server's max_message_size %d: raise max_message_size in rabbitmq.conf (and --rabbitmq-max-message-bytes)", len(rec.Value), maxBody)}
	}
	if k := s.routingKey(rec); len(k) > 255 {
		return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("the routing key is %d bytes, more than AMQP's 255: shorten the topic (or the key, with the key in the routing key)", len(k))}
	}
	if frame > 0 {
		if n := propertiesSize(rec); n > frame-propertiesSlack {
			return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("the message's headers take about %d bytes, more than fit the connection's frame_max %d: fewer or smaller header columns, or a larger frame_max on the server", n, frame)}
		}
	}
	return nil
}

// propertiesSlack covers the content header frame's fixed fields and the
// properties outboxd sets besides the headers.
const propertiesSlack = 1024

// propertiesSize is what the headers table takes on the wire: a short
// string name, a type octet and a long string value per header, twice for
// id and type (also message_id and type properties).
func propertiesSize(rec *router.Record) int {
	n := 4 + 1 + len(KeyHeader) + 1 + 4 + len(rec.Key)
	for _, h := range rec.Headers {
		n += 1 + len(h.Key) + 1 + 4 + len(h.Value)
		if h.Key == "id" || h.Key == "type" {
			n += 1 + len(h.Value)
		}
	}
	return n
}

// Probe publishes rec and waits for its confirm.
func (s *Sink) Probe(ctx context.Context, rec *router.Record) error {
	if err := s.Check(ctx, rec); err != nil {
		return err
	}
	res := make(chan error, 1)
	s.Produce(ctx, rec, func(err error) { res <- err })
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return &sink.Error{Kind: sink.Transient, Err: fmt.Errorf("rabbitmq: no confirm: %w", s.reason(ctx.Err()))}
	}
}

// Ping reports whether the server answers on the publishing connection:
// it waits (until ctx ends) for a channel in confirm mode, then opens and
// closes a channel of its own on the same connection, a round trip. A
// connection that is open but gets no answer (a network partition, a
// server that stopped reading) is therefore reported at the next Ping,
// not only when its heartbeats time out.
func (s *Sink) Ping(ctx context.Context) error {
	for {
		s.mu.Lock()
		up, upc, closed, conn := s.up, s.upc, s.closed, s.conn
		s.mu.Unlock()
		if up && conn != nil {
			return s.roundTrip(ctx, conn)
		}
		if closed {
			return errors.New("rabbitmq: sink closed")
		}
		select {
		case <-upc:
		case <-ctx.Done():
			return s.reason(ctx.Err())
		}
	}
}

// roundTrip opens and closes a channel on conn, giving up when ctx ends.
// amqp091's calls take no context, so the exchange runs in a goroutine
// that ends when the server answers or the connection dies (heartbeats);
// one at a time: while one is unanswered, Ping fails at once.
func (s *Sink) roundTrip(ctx context.Context, conn *amqp.Connection) error {
	s.mu.Lock()
	if s.pinging != nil {
		since := s.pingSince
		s.mu.Unlock()
		return fmt.Errorf("rabbitmq: the server has not answered for %s (a network partition, or a server that stopped reading); the connection is dropped when its heartbeats time out (%s)", time.Since(since).Round(time.Millisecond), 3*heartbeat)
	}
	res, since := make(chan error, 1), time.Now()
	s.pinging, s.pingSince = res, since
	s.mu.Unlock()
	go func() { // owned by roundTrip's callers: ends with the connection at the latest
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Close()
		}
		if err != nil {
			err = fmt.Errorf("rabbitmq: %w", err)
		}
		s.mu.Lock()
		if s.pinging == res {
			s.pinging = nil
		}
		s.mu.Unlock()
		res <- err
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq: the server did not answer within %s (a network partition, or a server that stopped reading): %w", time.Since(since).Round(time.Millisecond), ctx.Err())
	}
}

// reason is the last connection error, or err if there is none.
func (s *Sink) reason(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastErr != nil {
		return s.lastErr
	}
	return err
}

// Close stops the publisher; records not yet confirmed fail (Transient).
func (s *Sink) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return
	}
	s.closed = true
	conn := s.conn
	s.mu.Unlock()
	close(s.stop)
	if conn != nil {
		// A publish blocked on a server that stopped reading (a memory or
		// disk alarm) fails once the socket's deadline passes.
		go func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	}
	<-s.done
	s.mu.Lock()
	left := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, e := range left {
		e.finish(&sink.Error{Kind: sink.Transient, Err: errors.New("rabbitmq: sink closed before the server confirmed the message")})
	}
}

// run owns the connection: it connects with backoff, publishes on one
// channel until that channel is lost, and starts over. It returns when the
// sink is closed.
func (s *Sink) run() {
	defer close(s.done)
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		conn, ch, err := s.connect()
		s.held(err)
		if err != nil {
			// Once per outage at Warn (the monitor reports the broker's
			// state too); the retries at Debug.
			level := slog.LevelDebug
			if s.setDown(err) {
				level = slog.LevelWarn
			}
			s.log.Log(context.Background(), level, "rabbitmq: cannot open a publishing channel; retrying", "err", err, "retry_in", backoff)
			select {
			case <-s.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		served := time.Now()
		err = s.serve(conn, ch)
		if time.Since(served) > 10*time.Second {
			backoff = 100 * time.Millisecond // a channel that lasted: the next outage starts afresh
		}
		_ = conn.CloseDeadline(time.Now().Add(time.Second)) // a no-op after serve's
		if err == nil {
			continue // closed
		}
		s.setDown(err)
		s.log.Warn("rabbitmq: lost the publishing channel; publishing the unconfirmed messages again on a new one", "err", err)
		if time.Since(served) <= 10*time.Second {
			// A channel the server keeps closing (an error this sink does
			// not know) must not become a reconnection loop.
			select {
			case <-s.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// setDown records why no channel is open; it reports whether this is the
// first failure since one was.
func (s *Sink) setDown(err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := s.up || s.lastErr == nil
	if s.up {
		s.up = false
		s.upc = make(chan struct{})
	}
	s.lastErr = err
	return first
}

// connect dials, opens a channel in confirm mode and makes sure the
// exchange exists (declaring it if configured).
func (s *Sink) connect() (*amqp.Connection, *amqp.Channel, error) {
	conn, err := dial(s.cfg.URL, s.cfg.TLS, s.cfg.DialTimeout, publisherConnName)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		if s.cfg.Declare {
			err = ch.ExchangeDeclare(s.exchange, s.cfg.ExchangeType, true, false, false, false, nil)
		} else {
			err = ch.ExchangeDeclarePassive(s.exchange, s.cfg.ExchangeType, true, false, false, false, nil)
		}
		if err != nil {
			err = exchangeError(s.exchange, s.cfg.Declare, err)
		}
	}
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
		return nil, nil, fmt.Errorf("rabbitmq: %w", err)
	}
	return conn, ch, nil
}

// held tells Config.Held when the exchange goes missing or comes back.
func (s *Sink) held(err error) {
	if s.cfg.Held == nil {
		return
	}
	var me *missingExchange
	switch missing := errors.As(err, &me); {
	case missing && !s.holding:
		s.holding = true
		s.cfg.Held("exchange "+s.exchange, err)
	case err == nil && s.holding:
		s.holding = false
		s.cfg.Held("exchange "+s.exchange, nil)
	}
}

// missingExchange is a connection attempt that found no exchange.
type missingExchange struct{ err error }

func (e *missingExchange) Error() string { return e.err.Error() }
func (e *missingExchange) Unwrap() error { return e.err }

func exchangeError(name string, declare bool, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.NotFound:
			return &missingExchange{fmt.Errorf("exchange %q does not exist: declare it (a durable topic exchange), or let outboxd declare it (--rabbitmq-declare-exchange): %w", name, err)}
		case amqp.PreconditionFailed:
			return fmt.Errorf("exchange %q exists with other settings than outboxd declares (durable, the configured type): %w", name, err)
		case amqp.AccessRefused:
			if declare {
				return fmt.Errorf("this user may not declare exchange %q (configure permission): declare it yourself and turn off --rabbitmq-declare-exchange, or grant it: %w", name, err)
			}
		}
	}
	return fmt.Errorf("exchange %q: %w", name, err)
}

// heartbeat is the AMQP heartbeat outboxd asks for. amqp091 drops a
// connection that has received nothing for three of them, so a partition
// that keeps the socket open (no RST, no FIN) ends the channel after 15 s,
// and its unconfirmed messages are published again on a new one; the
// server drops outboxd's side after two.
const heartbeat = 5 * time.Second

// writeTimeout bounds one write to the server's socket. A peer that stops
// reading (a partition that drops packets, a stalled proxy) fills the
// socket's buffer and blocks the publish writing to it; amqp091 sets no
// write deadline, and its heartbeat timeout cannot end that publish: the
// connection's shutdown waits for the channel lock the blocked publish
// holds. So every write has a deadline of its own: a publish blocked this
// long fails, the connection is closed, and the unconfirmed messages go to
// the next one.
const writeTimeout = 3 * heartbeat

// writeDeadlineConn is a net.Conn whose every Write has a deadline.
type writeDeadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c writeDeadlineConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// The connections' names (the client property connection_name), which the
// management UI and rabbitmqctl list_connections show: the publisher's
// connection carries the events; the progress record has its own.
const (
	publisherConnName = "outboxd publisher"
	progressConnName  = "outboxd progress"
)

// dial connects with a bounded dial and handshake, naming the connection.
func dial(url string, tlsCfg *tls.Config, timeout time.Duration, name string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Heartbeat:       heartbeat,
		Locale:          "en_US",
		TLSClientConfig: tlsCfg,
		Properties:      amqp.Table{"connection_name": name},
		// A bounded dial and handshake: a server that accepts and says
		// nothing must not hang the publisher (heartbeats start later).
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := amqp.DefaultDial(timeout)(network, addr)
			if err != nil {
				return nil, err
			}
			return writeDeadlineConn{Conn: c, timeout: writeTimeout}, nil
		},
	}
	conn, err := amqp.DialConfig(url, cfg)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connect to %s: %w", redactURL(url), err)
	}
	return conn, nil
}

// serve publishes on ch until it or the connection closes, or the sink is
// closed. Its confirm reader runs in a goroutine serve waits for. What was
// published and not confirmed goes back to the front of the line.
func (s *Sink) serve(conn *amqp.Connection, ch *amqp.Channel) error {
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, s.cfg.Window+1))
	// Unbuffered: the library delivers a message's basic.return before its
	// basic.ack, so when the reader takes an ack, the return is in.
	returns := ch.NotifyReturn(make(chan amqp.Return))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))

	var (
		umu         sync.Mutex
		unconfirmed []*entry // published on ch, by tag
		nextTag     uint64   = 1
		room                 = make(chan struct{}, 1)
		hdrs                 = make(amqp.Table, 8) // every message's headers, in turn (see entry)
	)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.up, s.lastErr, s.conn = true, nil, conn
	s.frame = conn.Config.FrameSize
	close(s.upc)
	s.mu.Unlock()

	readerDone := make(chan struct{})
	go func() { // owned by serve: it waits for readerDone before returning
		defer close(readerDone)
		s.readConfirms(confirms, returns, &umu, &unconfirmed, room)
	}()

	var err error
loop:
	for {
		s.mu.Lock()
		batch := s.pending
		s.mu.Unlock()
		published := 0
		for _, e := range batch {
			umu.Lock()
			full := len(unconfirmed) >= s.cfg.Window
			if !full {
				e.tag = nextTag
				e.returned = nil
				unconfirmed = append(unconfirmed, e)
			}
			umu.Unlock()
			if full {
				break
			}
			// Taken off the line before the outcome is known: a failed
			// publish leaves e in unconfirmed, which goes back in front.
			published++
			if err = ch.Publish(s.exchange, e.key, true, false, message(&e.rec, hdrs)); err != nil {
				err = fmt.Errorf("rabbitmq: publish: %w", err)
				break
			}
			nextTag++
		}
		if published > 0 {
			s.mu.Lock()
			// The published entries leave the line; their slots are
			// cleared so that the backing array, which the line keeps
			// using, does not keep confirmed records alive.
			clear(s.pending[:published])
			s.pending = s.pending[published:]
			if len(s.pending) == 0 {
				s.pending = nil
			}
			s.mu.Unlock()
		}
		if err != nil {
			break loop
		}
		if published > 0 && published < len(batch) {
			continue // the window filled: wait for room below
		}
		select {
		case <-s.stop:
			break loop
		case e := <-chClosed:
			err = closeError("channel", e)
			break loop
		case e := <-connClosed:
			err = closeError("connection", e)
			break loop
		case <-s.wake:
		case <-room:
		}
	}
	// Ends the reader (the library closes confirms); bounded, as the server
	// may be gone without a word.
	_ = conn.CloseDeadline(time.Now().Add(time.Second))
	<-readerDone
	s.mu.Lock()
	s.conn = nil
	s.mu.Unlock()
	umu.Lock()
	back := unconfirmed
	unconfirmed = nil
	umu.Unlock()
	s.requeue(back, err)
	return err
}

// requeue puts the unconfirmed messages of a lost channel back in front of
// the line, in their order; the ones the server refused as too large fail.
func (s *Sink) requeue(back []*entry, cause error) {
	if len(back) == 0 {
		return
	}
	if denied := accessRefused(cause); denied != nil {
		// Waiting cannot fix a permission: every record fails, Denied, and
		// the relay stops with the error.
		s.mu.Lock()
		all := append(back, s.pending...)
		s.pending = nil
		s.mu.Unlock()
		for _, e := range all {
			e.finish(denied)
		}
		return
	}
	limit := tooLarge(cause)
	var refused []*entry
	s.mu.Lock()
	if limit > 0 && limit < s.maxBody {
		s.maxBody = limit
	}
	keep := make([]*entry, 0, len(back)+len(s.pending))
	for _, e := range back {
		if limit > 0 && len(e.rec.Value) > limit {
			refused = append(refused, e)
			continue
		}
		keep = append(keep, e)
	}
	s.pending = append(keep, s.pending...)
	s.mu.Unlock()
	for _, e := range refused {
		e.finish(&sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("the message body is %d bytes, more than the server's max_message_size %d (%v): raise max_message_size", len(e.rec.Value), limit, cause)})
	}
}

// accessRefused is the Denied error for a channel the server closed with
// 403 ACCESS_REFUSED (no write permission on the exchange), nil otherwise.
func accessRefused(cause error) error {
	var ae *amqp.Error
	if !errors.As(cause, &ae) || ae.Code != amqp.AccessRefused {
		return nil
	}
	return &sink.Error{Kind: sink.Denied, Err: fmt.Errorf("%w: grant this user write permission on the exchange (rabbitmqctl set_permissions)", cause)}
}

// tooLarge is the server's max_message_size when cause is the channel
// error RabbitMQ closes a channel with for a larger message.
func tooLarge(cause error) int {
	var ae *amqp.Error
	if !errors.As(cause, &ae) || ae.Code != amqp.PreconditionFailed {
		return 0
	}
	const marker = "larger than configured max size "
	i := strings.Index(ae.Reason, marker)
	if i < 0 {
		return 0
	}
	digits := ae.Reason[i+len(marker):]
	j := 0
	for j < len(digits) && digits[j] >= '0' && digits[j] <= '9' {
		j++
	}
	n, _ := strconv.Atoi(digits[:j])
	return n
}

// closedError says why a channel or connection closed.
type closedError struct {
	what string
	err  *amqp.Error
}

func (e *closedError) Error() string {
	if e.err == nil {
		return "rabbitmq: " + e.what + " closed"
	}
	return fmt.Sprintf("rabbitmq: %s closed: %v", e.what, e.err)
}

func (e *closedError) Unwrap() error {
	if e.err == nil {
		return nil
	}
	return e.err
}

func closeError(what string, e *amqp.Error) error { return &closedError{what: what, err: e} }

// readConfirms settles published messages as the server confirms them: an
// ack without a return is a delivery, an ack after a return (no queue bound
// for the routing key) or a nack is a refusal. Confirms arrive in tag order.
func (s *Sink) readConfirms(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, umu *sync.Mutex, unconfirmed *[]*entry, room chan struct{}) {
	var lastReturned uint64
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			umu.Lock()
			for _, e := range *unconfirmed {
				if e.tag > lastReturned && e.key == r.RoutingKey && e.messageIDIs(r.MessageId) && len(e.rec.Value) == len(r.Body) {
					rr := r
					e.returned, lastReturned = &rr, e.tag
					break
				}
			}
			umu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				return
			}
			umu.Lock()
			var e *entry
			if len(*unconfirmed) > 0 && (*unconfirmed)[0].tag == c.DeliveryTag {
				e = (*unconfirmed)[0]
				(*unconfirmed)[0] = nil
				*unconfirmed = (*unconfirmed)[1:]
			}
			umu.Unlock()
			if e == nil {
				continue // a tag this sink never published: cannot happen
			}
			select {
			case room <- struct{}{}:
			default:
			}
			switch {
			case !c.Ack:
				e.finish(&sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("rabbitmq refused the message (basic.nack) for exchange %q, routing key %q: a queue it routes to refused it (x-overflow reject-publish and full, or unavailable): make room or change the queue", s.exchange, e.key)})
			case e.returned != nil:
				e.finish(&sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("rabbitmq returned the message as unroutable (%d %s): no queue is bound to exchange %q for routing key %q; bind one (a durable quorum queue)", e.returned.ReplyCode, e.returned.ReplyText, s.exchange, e.key)})
			default:
				e.finish(nil)
			}
		}
	}
}

// redactURL hides the password of an AMQP URI.
func redactURL(u string) string {
	uri, err := amqp.ParseURI(u)
	if err != nil {
		return "(unparseable URL)"
	}
	if uri.Password != "" {
		uri.Password = "xxxxx"
	}
	return uri.String()
}

var _ sink.Sink = (*Sink)(nil)

// Name is the broker's name in the engine's messages and labels (sink.Namer).
func (s *Sink) Name() string { return "rabbitmq" }

// Message is the AMQP message Produce publishes for rec, byte for byte:
// what a bare publisher beside outboxd sends to compare like with like
// (test/bench).
func Message(rec *router.Record) amqp.Publishing { return message(rec, nil) }
