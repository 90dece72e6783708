// Package nats is the NATS JetStream sink, built on nats.go's jetstream
// package: one connection, asynchronous publishes whose PubAck (the stream
// has stored the message, on file and, with replicas, on a quorum) is the
// sink's acknowledgement.
//
// Order. A routed topic is a subject (optionally followed by the key as
// more tokens, Config.KeyToken), and a JetStream stream stores what one
// connection publishes in the order it was sent. Pipelining makes one thing
// unsafe: a publish that fails (a stream without a leader, an ack timeout)
// while later ones are already on their way, which may be stored; the
// replay would then store the failed one after them, and JetStream's
// duplicate window would drop their second copies: order lost. So every
// publish names the message published before it on the same stream
// (Nats-Expected-Last-Msg-Id, the event id of that message): JetStream
// refuses a message whose predecessor is not the stream's last, and what
// the stream holds is always a prefix of what was published to it, in
// order. After a failure the sink refuses new publishes (the fence) until
// the failed session's records have settled and the relay starts over.
//
// Duplicates. Nats-Msg-Id is the event id, so the stream's duplicate window
// (Config.DuplicateWindow on streams outboxd creates) drops the replays of a
// restart; a replay longer than the window reaches consumers again, in order.
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// Config configures the sink.
type Config struct {
	// URL is the server, or a comma-separated list of a cluster's servers
	// (nats://host:4222,nats://host2:4222).
	URL string
	// Options are extra nats.go options: credentials, TLS, a name.
	Options []nats.Option
	// KeyToken appends the record key to the subject as more tokens
	// (outbox.event.Order.order-1), so a consumer can filter one aggregate;
	// a record without a key goes to the topic's subject itself. The
	// topic's stream must capture "<topic>.>" (streams outboxd creates do).
	KeyToken bool
	// CreateStreams creates a stream for a topic no stream captures, named
	// after the topic (dots become underscores), with subjects "<topic>"
	// and "<topic>.>", file storage and StreamReplicas replicas. Without
	// it, such an event is rejected (--on-invalid applies).
	CreateStreams  bool
	StreamReplicas int // replicas of streams outboxd creates (default 1)
	// DuplicateWindow of streams outboxd creates (default 2m, JetStream's):
	// replays within it are dropped by Nats-Msg-Id.
	DuplicateWindow time.Duration
	// MaxPending is the most publishes awaiting their PubAck; the relay's
	// in-flight bound must be lower (default 60000).
	MaxPending int
	// AckTimeout fails a publish whose PubAck does not come (default 30s),
	// within 1.25 times it (sweep): the session restarts and replays it.
	AckTimeout time.Duration
	Logger     *slog.Logger // may be nil
	// Durability, if set, hears each stream that can lose messages it
	// acknowledged (durability.go), when the sink first looks it up.
	Durability func(dest, warning string)
}

// Sink is a JetStream publisher.
type Sink struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	log *slog.Logger

	send    sync.Mutex // held across a publish, to keep order
	mu      sync.Mutex // the fields below
	pending map[*nats.Msg]*publish
	// last is, per stream, the event id of the message published to it
	// last since the fence lifted; "" or missing: the next publish names no
	// predecessor.
	last map[string]string
	// fenced: a publish failed; every Produce fails until the failed
	// session's records have settled. fencedCalls counts the Produce calls
	// refused since (see admit).
	fenced      bool
	fencedCalls int
	closed      bool
	// stored: the streams that have stored a message of this sink's (a
	// PubAck not marked duplicate) since it started or the fence lifted;
	// until then a duplicate is a resend (duplicates.go).
	stored map[string]bool

	// tick counts the sweep's ticks; each publish is stamped with it.
	tick uint32

	resends, reused atomic.Int64   // duplicate PubAcks (duplicates.go)
	checks          sync.WaitGroup // duplicates being compared with the stored message
	sweeps          sync.WaitGroup // the sweep
	ctx             context.Context
	cancel          context.CancelFunc

	streams streamCache
}

// publish is one record awaiting its PubAck: done, or ack when it came
// through ProduceAck.
type publish struct {
	topic string
	tick  uint32                // Sink.tick when it was sent
	done  func(error)           // Produce's
	ack   func(sink.Ack, error) // ProduceAck's
	cb    sink.Callback         // ProduceCallback's
}

// finish reports the outcome; a is the PubAck's place (sink.NoAck on a
// failure).
func (p *publish) finish(a sink.Ack, err error) {
	switch {
	case p.cb != nil:
		p.cb.Done(err)
	case p.ack != nil:
		p.ack(a, err)
	default:
		p.done(err)
	}
}

// New connects to the server. A server that is down is retried in the
// background (nats.go's RetryOnFailedConnect) and publishes fail until it is
// up, which the relay handles like a broker that goes down later.
func New(cfg Config) (*Sink, error) {
	if cfg.URL == "" {
		return nil, errors.New("nats: no server URL (--broker nats://host:4222)")
	}
	if cfg.StreamReplicas == 0 {
		cfg.StreamReplicas = 1
	}
	if cfg.DuplicateWindow == 0 {
		cfg.DuplicateWindow = 2 * time.Minute
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = 60000
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 30 * time.Second
	}
	s := &Sink{cfg: cfg, log: cfg.Logger, pending: map[*nats.Msg]*publish{}, last: map[string]string{}, stored: map[string]bool{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	opts := []nats.Option{
		nats.Name("outboxd"),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		// No reconnect buffer: a publish made while disconnected fails at
		// once instead of being sent later, behind publishes that failed.
		nats.ReconnectBufSize(-1),
		// A connection that died silently (a cut network) is noticed after
		// two unanswered pings, ~10 s, instead of nats.go's 2-minute pings;
		// its publishes then fail and are replayed.
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				s.log.Warn("nats: disconnected", "err", err)
			}
		}),
		nats.ErrorHandler(s.asyncError),
		nats.ReconnectHandler(func(c *nats.Conn) { s.log.Info("nats: reconnected", "server", c.ConnectedUrlRedacted()) }),
	}
	nc, err := nats.Connect(cfg.URL, append(opts, cfg.Options...)...)
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("nats: connect %s: %w", redactURL(cfg.URL), err)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		// No WithPublishAsyncTimeout: the sweep times publishes out.
		jetstream.WithPublishAsyncAckHandler(s.acked),
		jetstream.WithPublishAsyncErrHandler(s.failed),
	)
	if err != nil {
		nc.Close()
		s.cancel()
		return nil, fmt.Errorf("nats: %w", err)
	}
	s.nc, s.js = nc, js
	s.streams.s = s
	s.sweeps.Add(1)
	go s.sweep()
	return s, nil
}

// sweepTicks is how many of the sweep's ticks make the ack timeout.
const sweepTicks = 4

// sweep fails the publishes whose PubAck has not come within AckTimeout.
// nats.go would, but with a timer per publish (two allocations and a
// timer-heap entry each, which A/B drains showed in outboxd's CPU).
// Instead each publish is stamped with the count of one ticker of period
// AckTimeout/sweepTicks, and a publish more than sweepTicks ticks old
// fails: between AckTimeout and 1.25 times it after it was sent. nats.go
// still holds its own future for each until a PubAck comes, and at
// MaxPending of them it would stall every publish; so the sink then
// reconnects, which fails and drops every future, and the relay replays
// from the slot as after any failed publish. Owned by the sink: Close
// stops it.
func (s *Sink) sweep() {
	defer s.sweeps.Done()
	t := time.NewTicker(max(s.cfg.AckTimeout/sweepTicks, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		var late []*publish
		s.mu.Lock()
		s.tick++
		for m, p := range s.pending {
			if s.tick-p.tick > sweepTicks {
				late = append(late, p)
				delete(s.pending, m)
			}
		}
		s.mu.Unlock()
		if len(late) == 0 {
			continue
		}
		s.log.Warn("nats: no PubAck within the ack timeout (--nats-ack-timeout); reconnecting, and the relay replays from the slot",
			"publishes", len(late), "ack_timeout", s.cfg.AckTimeout.String())
		err := classify(jetstream.ErrAsyncPublishTimeout)
		s.fail(err)
		for _, p := range late {
			s.streams.forget(p.topic) // made no_ack since it was looked up?
			p.finish(sink.NoAck, err)
		}
		if err := s.nc.ForceReconnect(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			s.log.Warn("nats: reconnecting after an ack timeout", "err", err)
		}
	}
}

// Subject is the subject rec is published to.
func (s *Sink) Subject(rec *router.Record) string {
	if !s.cfg.KeyToken || len(rec.Key) == 0 {
		return rec.Topic
	}
	return rec.Topic + "." + string(rec.Key)
}

// Message converts a routed record to a NATS message: the value verbatim
// as the data, each header as a NATS header of the same name (case kept),
// the key in the Outboxd-Key header, and Nats-Msg-Id from the id header.
func (s *Sink) Message(rec *router.Record) *nats.Msg {
	o := new(outgoing)
	s.message(rec, o)
	return &o.msg
}

// outgoing is one publish's memory: the message, its outcome's callback
// and its header values' []string slices, in one allocation. The header
// values are converted to strings in one more, and the header map is
// nats.go's own (two): four per message, rather than two per header and
// three for the message, the callback and the ordering guard.
type outgoing struct {
	msg  nats.Msg
	p    publish
	vals [8]string // the []string values' backing array, when they fit
	// guard is the ordering guard's value: empty, with room for one string
	// in vals (or in the array made when they did not fit).
	guard []string
}

// message builds rec's message into o.msg. The header values' []string
// slices share one backing array (each a full slice of it, so that a
// repeated header name appends into a copy), with one slot left for the
// ordering guard (produce's Nats-Expected-Last-Msg-Id).
func (s *Sink) message(rec *router.Record, o *outgoing) {
	size, slots := len(rec.Key), len(rec.Headers)+2
	for _, h := range rec.Headers {
		size += len(h.Value)
		if h.Key == "id" {
			slots++
		}
	}
	var b strings.Builder
	b.Grow(size)
	for _, h := range rec.Headers {
		b.Write(h.Value)
	}
	b.Write(rec.Key)
	all, vals := b.String(), o.vals[:0]
	if slots > len(o.vals) {
		vals = make([]string, 0, slots)
	}
	one := func(v string) []string {
		vals = append(vals, v)
		return vals[len(vals)-1 : len(vals) : len(vals)]
	}
	m := &o.msg
	*m = nats.Msg{Subject: s.Subject(rec), Data: rec.Value, Header: make(nats.Header, len(rec.Headers)+3)}
	for _, h := range rec.Headers {
		v := all[:len(h.Value)]
		all = all[len(h.Value):]
		if cur, ok := m.Header[h.Key]; ok {
			m.Header[h.Key] = append(cur, v)
		} else {
			m.Header[h.Key] = one(v)
		}
		if h.Key == "id" && len(h.Value) > 0 {
			m.Header[jetstream.MsgIDHeader] = one(v)
		}
	}
	if rec.Key != nil {
		m.Header[KeyHeader] = one(all)
	}
	o.guard = one("")[:0:1]
}

// KeyHeader carries the record key (NATS messages have no key field).
const KeyHeader = "Outboxd-Key"

// Produce publishes rec; done runs once the stream has stored it, or with a
// sink.Error saying how to handle the failure.
func (s *Sink) Produce(ctx context.Context, rec *router.Record, done func(error)) {
	s.produce(ctx, rec, &outgoing{p: publish{topic: rec.Topic, done: done}})
}

var (
	_ sink.Acker            = (*Sink)(nil)
	_ sink.CallbackProducer = (*Sink)(nil)
)

// ProduceCallback is Produce calling cb.Done (sink.CallbackProducer): the
// relay's per-event state is the callback, no closure. Nothing of rec is
// kept past the call but its value's bytes, which the message's data
// shares until cb.Done (sink.Releaser).
func (s *Sink) ProduceCallback(ctx context.Context, rec *router.Record, cb sink.Callback) {
	s.produce(ctx, rec, &outgoing{p: publish{topic: rec.Topic, cb: cb}})
}

var _ sink.Releaser = (*Sink)(nil)

// ReleasesAtDone: a publish's outcome is the last time the sink or nats.go
// reads its record's bytes (sink.Releaser), so the relay builds the next
// records in the memory of those acked. nats.go has written the message
// to the connection before the PubAck can come, retries nothing
// (noRetries) and keeps no buffer to send again on a reconnect
// (ReconnectBufSize -1); the header values and the key are copies; a
// duplicate's comparison with the stored message, which runs after the
// ack, takes a copy of the data first (duplicateAck); a publish that timed
// out or was refused is never read again, even if its PubAck comes late
// (acked finds no publish for it).
func (*Sink) ReleasesAtDone() {}

// ProduceAck is Produce passing done the PubAck's stream sequence
// (sink/otel's span attribute).
func (s *Sink) ProduceAck(ctx context.Context, rec *router.Record, done func(sink.Ack, error)) {
	s.produce(ctx, rec, &outgoing{p: publish{topic: rec.Topic, ack: done}})
}

func (s *Sink) produce(ctx context.Context, rec *router.Record, o *outgoing) {
	s.message(rec, o)
	m, p := &o.msg, &o.p
	// send keeps the socket's order the order of last; mu is never held
	// while nats.go's publisher lock is taken (its timeout callback holds
	// that lock and takes mu).
	s.send.Lock()
	defer s.send.Unlock()
	s.mu.Lock()
	err := s.admit()
	s.mu.Unlock()
	if err != nil {
		p.finish(sink.NoAck, err)
		return
	}
	stream, err := s.streams.lookup(ctx, rec.Topic, m.Subject)
	if err != nil {
		// No stream is a rejection here rather than in Check: the relay
		// then retries the event alone with backoff (--on-invalid fail) and
		// streams on as soon as someone creates the stream.
		kind := sink.Transient
		if errors.Is(err, errNoStream) || errors.Is(err, errNoAck) {
			kind = sink.Rejected
		}
		s.fail(err)
		p.finish(sink.NoAck, &sink.Error{Kind: kind, Err: err})
		return
	}
	id := m.Header.Get(jetstream.MsgIDHeader)
	s.mu.Lock()
	if prev := s.last[stream]; prev != "" {
		m.Header[jetstream.ExpectedLastMsgIDHeader] = append(o.guard, prev)
	}
	// A message without an id cannot be named by the next one: that one
	// then names no predecessor.
	s.last[stream] = id
	p.tick = s.tick
	s.pending[m] = p
	s.mu.Unlock()
	if _, err = s.js.PublishMsgAsync(m, noRetries); err != nil {
		if s.take(m) == nil {
			return // failed through the callback already
		}
		err = classify(err)
		s.fail(err)
		p.finish(sink.NoAck, err)
	}
}

// noRetries is every publish's WithRetryAttempts(0), made once rather
// than a closure per publish (the option keeps no state).
var noRetries = jetstream.WithRetryAttempts(0)

// admit refuses a publish while the fence is up. The fence goes up at a
// failure, and the relay stops producing at its next read after it sees
// the failure: at most one more Produce of the failed session can come
// (the one it was making). So the fence lifts at the first Produce after at
// least one was refused and every earlier publish has settled; a new
// session that finds the fence still up has its first record refused and
// starts once more. The first publish to each stream after the fence names
// no predecessor: the stream ends where the replay resumes. Called with mu.
func (s *Sink) admit() error {
	if s.closed {
		return &sink.Error{Kind: sink.Transient, Err: errors.New("nats: sink closed")}
	}
	if !s.fenced {
		return nil
	}
	if s.fencedCalls > 0 && len(s.pending) == 0 {
		s.fenced, s.fencedCalls = false, 0
		clear(s.last)
		clear(s.stored) // the relay replays from the slot: resends come first
		return nil
	}
	s.fencedCalls++
	return &sink.Error{Kind: sink.Transient, Err: errors.New("nats: an earlier publish failed; holding publishes until the relay resumes from the slot, so that no event overtakes it")}
}

// fail raises the fence.
func (s *Sink) fail(error) {
	s.mu.Lock()
	if !s.fenced {
		s.fenced, s.fencedCalls = true, 0
	}
	s.mu.Unlock()
}

func (s *Sink) take(m *nats.Msg) *publish {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending[m]
	delete(s.pending, m)
	return p
}

// acked is nats.go's PubAck callback (one goroutine, in PubAck order).
func (s *Sink) acked(_ jetstream.JetStream, m *nats.Msg, pa *jetstream.PubAck) {
	s.mu.Lock()
	p := s.pending[m]
	delete(s.pending, m)
	if p != nil && pa != nil && !pa.Duplicate {
		s.stored[pa.Stream] = true
	}
	s.mu.Unlock()
	if p == nil {
		return
	}
	a := sink.NoAck
	if pa != nil {
		a.Sequence = pa.Sequence
		if pa.Duplicate {
			s.duplicateAck(m, pa)
		}
	}
	p.finish(a, nil)
}

// failed is nats.go's callback for a publish that failed: an error in the
// PubAck, a timeout, a lost connection.
func (s *Sink) failed(_ jetstream.JetStream, m *nats.Msg, err error) {
	p := s.take(m)
	if p == nil {
		return
	}
	err = classify(err)
	if isNoStream(err) {
		s.streams.forget(p.topic) // deleted since Check looked it up?
	}
	s.fail(err)
	p.finish(sink.NoAck, err)
}

// Ping checks that the server answers and JetStream is enabled for the
// account.
func (s *Sink) Ping(ctx context.Context) error {
	if !s.nc.IsConnected() {
		return fmt.Errorf("nats: not connected to %s (%s)", redactURL(s.cfg.URL), s.nc.Status())
	}
	if _, err := s.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("nats: JetStream does not answer on %s: %w", redactURL(s.cfg.URL), err)
	}
	return nil
}

// Probe publishes rec and waits for its PubAck.
func (s *Sink) Probe(ctx context.Context, rec *router.Record) error {
	done := make(chan error, 1)
	s.Produce(ctx, rec, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the connection; publishes awaiting their PubAck fail.
func (s *Sink) Close() {
	s.nc.Close()
	s.mu.Lock()
	s.closed = true
	left := s.pending
	s.pending = map[*nats.Msg]*publish{}
	s.mu.Unlock()
	s.cancel()
	s.checks.Wait()
	s.sweeps.Wait()
	for _, p := range left {
		p.finish(sink.NoAck, &sink.Error{Kind: sink.Transient, Err: errors.New("nats: sink closed before the PubAck")})
	}
}

// redactURL drops credentials from a server URL list.
func redactURL(u string) string {
	parts := strings.Split(u, ",")
	for i, p := range parts {
		if at := strings.LastIndex(p, "@"); at >= 0 {
			if sch := strings.Index(p, "://"); sch >= 0 && sch < at {
				parts[i] = p[:sch+3] + "REDACTED" + p[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}

// The broker contracts Sink and ProgressStore implement.
var (
	_ sink.Sink          = (*Sink)(nil)
	_ sink.ProgressStore = ProgressStore{}
)

// Name is the broker's name in the engine's messages and labels (sink.Namer).
func (s *Sink) Name() string { return "nats" }
