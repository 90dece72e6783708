package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// stream is what the sink knows of the stream that captures a topic.
type stream struct {
	name       string
	maxMsgSize int32 // -1: no limit of its own
}

// streamCache maps topics to their streams. It is keyed by topic, not by
// subject, so that a subject per aggregate (Config.KeyToken) costs one
// lookup per topic: every subject of a topic must go to the topic's stream.
type streamCache struct {
	s  *Sink
	mu sync.Mutex
	m  map[string]stream
}

// errNoStream is the lookup's answer for a topic no stream captures;
// errNoAck for one whose stream does not acknowledge publishes. Either
// rejects the event until someone fixes the stream.
var (
	errNoStream = errors.New("no JetStream stream captures subject")
	errNoAck    = errors.New("does not acknowledge publishes (no_ack: true)")
)

// get returns the topic's stream, looking it up (and creating it, with
// CreateStreams) the first time.
func (c *streamCache) get(ctx context.Context, topic, subject string) (stream, error) {
	c.mu.Lock()
	st, ok := c.m[topic]
	c.mu.Unlock()
	if ok {
		return st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	name, err := c.s.js.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if !c.s.cfg.CreateStreams {
			return stream{}, fmt.Errorf("%w %s: create one (nats stream add --subjects '%s,%s.>'), or run with --nats-create-streams", errNoStream, subject, topic, topic)
		}
		if name, err = c.s.createStream(ctx, topic); err == nil {
			// A stream of that name may exist already with other subjects
			// (topics a.b and a_b share a name): it must capture this one.
			if got, lerr := c.s.js.StreamNameBySubject(ctx, subject); lerr != nil || got != name {
				return stream{}, fmt.Errorf("%w %s: stream %s exists but does not capture %s: add the subject to it, or create a stream for it", errNoStream, subject, name, subject)
			}
		}
	}
	if err != nil {
		return stream{}, err
	}
	info, err := c.s.js.Stream(ctx, name)
	if err != nil {
		return stream{}, fmt.Errorf("nats: stream %s: %w", name, err)
	}
	if info.CachedInfo().Config.NoAck {
		// Its publishes would never be acked, so nothing would be confirmed:
		// every session would wait out the ack timeout and replay for ever.
		// Not cached: the next event looks again, and streams once it acks.
		return stream{}, fmt.Errorf("stream %s %w: outboxd confirms an event only on its PubAck; fix: nats stream edit %s --ack", name, errNoAck, name)
	}
	c.s.durability(info.CachedInfo().Config)
	st = stream{name: name, maxMsgSize: info.CachedInfo().Config.MaxMsgSize}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]stream{}
	}
	c.m[topic] = st
	c.mu.Unlock()
	return st, nil
}

// lookup is get for Produce: the stream's name, or why it is unknown.
func (c *streamCache) lookup(ctx context.Context, topic, subject string) (string, error) {
	st, err := c.get(ctx, topic, subject)
	if err != nil {
		return "", fmt.Errorf("nats: the stream of subject %s: %w", subject, err)
	}
	return st.name, nil
}

func (c *streamCache) forget(topic string) {
	c.mu.Lock()
	delete(c.m, topic)
	c.mu.Unlock()
}

// StreamName is the name of the stream outboxd creates for topic.
func StreamName(topic string) string {
	return strings.NewReplacer(".", "_", "*", "_", ">", "_").Replace(topic)
}

func (s *Sink) createStream(ctx context.Context, topic string) (string, error) {
	cfg := jetstream.StreamConfig{
		Name:        StreamName(topic),
		Description: "created by outboxd for the outbox topic " + topic,
		Subjects:    []string{topic, topic + ".>"},
		Storage:     jetstream.FileStorage,
		Replicas:    s.cfg.StreamReplicas,
		Duplicates:  s.cfg.DuplicateWindow,
	}
	if _, err := s.js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return "", fmt.Errorf("nats: create stream %s for subjects %s and %s.>: %w", cfg.Name, topic, topic, err)
	}
	s.log.Info("nats: created stream", "stream", cfg.Name, "subjects", strings.Join(cfg.Subjects, ","), "replicas", cfg.Replicas, "duplicate_window", cfg.Duplicates.String())
	return cfg.Name, nil
}

// Check says, before the record is published, whether JetStream would
// refuse it for good: an invalid subject, or a message larger than the
// server's max_payload or the stream's max_msg_size. It creates the topic's
// stream if it is missing (CreateStreams). A topic without a stream is
// rejected by Produce instead, and an unreachable server is no verdict: the
// publish will fail and hold.
func (s *Sink) Check(ctx context.Context, rec *router.Record) error {
	subject := s.Subject(rec)
	if err := validSubject(subject); err != nil {
		return &sink.Error{Kind: sink.Rejected, Err: err}
	}
	size := recordSize(rec)
	if max := s.nc.MaxPayload(); max > 0 && int64(size) > max {
		return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("the message is %d bytes with its headers, more than the server's max_payload %d: raise max_payload", size, max)}
	}
	st, err := s.streams.get(ctx, rec.Topic, subject)
	switch {
	case err != nil:
		// No stream (Produce rejects the event, so the relay retries it
		// until one exists), or unknown yet (the server is down: the
		// publish fails and holds).
		return nil
	case st.maxMsgSize > 0 && size > int(st.maxMsgSize):
		return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("the message is %d bytes with its headers, more than stream %s's max_msg_size %d: raise it", size, st.name, st.maxMsgSize)}
	}
	return nil
}

// MessageSize is the size JetStream counts against max_payload and
// max_msg_size: the data and the encoded headers ("NATS/1.0\r\n", a
// "key: value\r\n" line per value, a blank line).
func MessageSize(m *nats.Msg) int {
	n := len(m.Data)
	if len(m.Header) == 0 {
		return n
	}
	n += len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// validSubject refuses what is not a publishable subject: empty tokens,
// wildcards, whitespace.
func validSubject(subj string) error {
	if subj == "" {
		return errors.New("empty subject")
	}
	for tok := range strings.SplitSeq(subj, ".") { // no slice: Check runs it per event
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("%q is not a valid NATS subject (empty tokens, wildcards and whitespace are not allowed): fix the row's topic or key, or turn --nats-key-token off", subj)
		}
	}
	return nil
}

// recordSize is MessageSize(s.Message(rec)) without building the message:
// Check sizes every event, and the message is six allocations. The sum
// is the message's wherever each header the message gets is one of rec's
// values or one the sink adds; a header named like one the sink sets, or
// a second id, makes the message replace a value, and is sized on the
// built message instead.
func recordSize(rec *router.Record) int {
	n, hdrs, ids := len(rec.Value), 0, 0
	line := func(k string, v int) { n, hdrs = n+len(k)+len(": ")+v+len("\r\n"), hdrs+1 }
	for _, h := range rec.Headers {
		switch h.Key {
		case jetstream.MsgIDHeader, KeyHeader:
			var s Sink
			return MessageSize(s.Message(rec))
		case "id":
			if ids++; ids > 1 {
				var s Sink
				return MessageSize(s.Message(rec))
			}
			if len(h.Value) > 0 {
				line(jetstream.MsgIDHeader, len(h.Value))
			}
		}
		line(h.Key, len(h.Value))
	}
	if rec.Key != nil {
		line(KeyHeader, len(rec.Key))
	}
	if hdrs > 0 {
		n += len("NATS/1.0\r\n") + len("\r\n")
	}
	return n
}
