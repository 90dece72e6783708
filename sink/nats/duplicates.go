package nats

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Duplicates. JetStream answers a message whose Nats-Msg-Id it stored
// within the stream's duplicate window with a PubAck marked Duplicate, and
// stores nothing: for the relay that is an ack like any other. Two causes
// look the same:
//
//   - a resend: outboxd publishing again what the stream already holds,
//     the replay after a restart or a failed publish (expected: the window
//     exists for it);
//   - a reused id: a different event with the id of one stored within the
//     window, which JetStream drops. Kafka and RabbitMQ deliver it; here it
//     is lost to consumers, so it is counted and logged at Warn.
//
// A replay resumes each stream where it ends (see the package comment on
// order), so its duplicates come first: from the sink's start or the
// fence's lifting until the stream's first PubAck that is not a duplicate,
// a duplicate is taken for a resend. After that, outboxd has no reason to
// publish an id twice, and a duplicate is compared with the message the
// stream stored under its id (the PubAck's sequence): the same subject,
// data and headers is a resend after all (a replay that outran the window,
// so that older events were stored again), anything else a reused id.

// DuplicateKind labels outboxd_nats_duplicates_total.
const (
	DuplicateResend = "resend"
	DuplicateReused = "duplicate_id"
)

// duplicate is what acked saw of a duplicate outside a replay, to compare
// with the stored message.
type duplicate struct {
	stream string
	seq    uint64
	msg    *nats.Msg
}

// duplicateAck classifies a PubAck's duplicate; called from acked.
func (s *Sink) duplicateAck(m *nats.Msg, pa *jetstream.PubAck) {
	s.mu.Lock()
	replaying, closed := !s.stored[pa.Stream], s.closed
	if !replaying && !closed {
		s.checks.Add(1) // under mu: Close waits only once closed is set
	}
	s.mu.Unlock()
	switch {
	case replaying:
		s.resends.Add(1)
		return
	case closed:
		return
	}
	// The data is the record's value, which the relay reuses once the
	// publish is done (sink.Releaser): the check, after it, reads a copy.
	d := duplicate{stream: pa.Stream, seq: pa.Sequence, msg: &nats.Msg{Subject: m.Subject, Header: m.Header, Data: bytes.Clone(m.Data)}}
	go func() { // owned by the sink: Close waits for it
		defer s.checks.Done()
		s.checkDuplicate(d)
	}()
}

// checkDuplicate compares d with the stored message it duplicates.
func (s *Sink) checkDuplicate(d duplicate) {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	stored, err := s.storedMsg(ctx, d.stream, d.seq)
	switch {
	case err == nil && sameMessage(d.msg, stored):
		s.resends.Add(1)
		return
	case err != nil && s.ctx.Err() != nil:
		return // closed: no verdict
	}
	s.reused.Add(1)
	id := d.msg.Header.Get(jetstream.MsgIDHeader)
	if err != nil {
		s.log.Warn("nats: JetStream dropped an event as a duplicate of one it stored within the stream's duplicate window (the stored message could not be read to tell a resend from a reused id, so it is counted as a reused id); "+
			"if it was a different event, it is lost to consumers: give every event an id of its own (a UUID)",
			"id", id, "stream", d.stream, "subject", d.msg.Subject, "stored_sequence", d.seq, "err", err)
		return
	}
	s.log.Warn("nats: JetStream dropped an event because another event with the same id was stored within the stream's duplicate window: the event is lost to consumers (Kafka and RabbitMQ would deliver it); "+
		"give every event an id of its own (a UUID)",
		"id", id, "stream", d.stream, "subject", d.msg.Subject, "stored_sequence", d.seq, "stored_subject", stored.Subject)
}

func (s *Sink) storedMsg(ctx context.Context, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	return st.GetMsg(ctx, seq)
}

// sameMessage says whether stored is m: the subject, the data and every
// header outboxd set, but the predecessor it named (which depends on what
// was published before it, not on the event).
func sameMessage(m *nats.Msg, stored *jetstream.RawStreamMsg) bool {
	if m.Subject != stored.Subject || !bytes.Equal(m.Data, stored.Data) {
		return false
	}
	for k := range maps.Keys(m.Header) {
		if k == jetstream.ExpectedLastMsgIDHeader {
			continue
		}
		if !slices.Equal(m.Header[k], stored.Header[k]) {
			return false
		}
	}
	return true
}

// Duplicates returns how many PubAcks were duplicates: resends of what the
// stream held, and different events with a reused id (dropped by
// JetStream) or duplicates that could not be told apart.
func (s *Sink) Duplicates() (resends, reused int64) {
	return s.resends.Load(), s.reused.Load()
}

// Collectors are the sink's series for the relay's /metrics:
// outboxd_nats_duplicates_total by kind.
func (s *Sink) Collectors() []prometheus.Collector {
	c := func(kind string, f func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "outboxd_nats_duplicates_total",
			Help:        "PubAcks JetStream marked duplicate (nothing stored), by kind: resend (outboxd published again what the stream holds, as after a restart) or duplicate_id (a different event reused an id stored within the duplicate window: dropped, lost to consumers).",
			ConstLabels: prometheus.Labels{"kind": kind},
		}, func() float64 { return float64(f()) })
	}
	return []prometheus.Collector{
		c(DuplicateResend, s.resends.Load),
		c(DuplicateReused, s.reused.Load),
	}
}
