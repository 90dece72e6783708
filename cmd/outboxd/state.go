package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// stalledAfter is how long the oldest unacked event may wait before /readyz
// calls the relay stalled.
const stalledAfter = time.Minute

// state is what the relay, the monitor and the HTTP handlers share.
type state struct {
	mu         sync.Mutex
	dsn        string // to mask its password in errors shown on /status and /readyz
	slotName   string
	maxSlotLag int64
	wm         *slot.Watermark // the current session's; nil before the first
	streaming  bool
	slotInfo   slot.Info // as read when the session started
	slot       slotView  // as last polled by the monitor
	kafkaOK    bool
	received   wal.LSN
	confirmed  wal.LSN // last flush position sent to the server
	lastErr    string
	lastErrAt  time.Time
	stalled    string            // why the relay holds on an event it may not pass
	topicHolds map[string]string // topics whose events the sink holds, and why
}

// setTopicHold records (err != nil) or clears a topic the sink cannot write
// to yet; kafka.TopicConfig.OnHold.
func (s *state) setTopicHold(topic string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.topicHolds, topic)
		return
	}
	if s.topicHolds == nil {
		s.topicHolds = map[string]string{}
	}
	s.topicHolds[topic] = err.Error()
	s.lastErr, s.lastErrAt = err.Error(), time.Now()
}

// topicHoldLocked is one held topic's reason, the first by name.
func (s *state) topicHoldLocked() string {
	first := ""
	for t := range s.topicHolds {
		if first == "" || t < first {
			first = t
		}
	}
	if first == "" {
		return ""
	}
	if n := len(s.topicHolds); n > 1 {
		return fmt.Sprintf("%s (and %d more topics held)", s.topicHolds[first], n-1)
	}
	return s.topicHolds[first]
}

func (s *state) setErr(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	s.lastErr, s.lastErrAt = redactText(err.Error(), s.dsn), time.Now()
	s.mu.Unlock()
}

// ready reports whether outboxd is doing its job, and if not, why.
func (s *state) ready() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stalled != "":
		return false, s.stalled
	case len(s.topicHolds) > 0:
		return false, s.topicHoldLocked()
	case !s.streaming:
		return false, "not streaming from the replication slot" + s.errSuffix()
	case !s.kafkaOK:
		return false, "kafka unreachable" + s.errSuffix()
	case s.maxSlotLag > 0 && s.slot.LagBytes > s.maxSlotLag:
		return false, fmt.Sprintf("slot lag %s above --max-slot-lag %s: %s", humanBytes(s.slot.LagBytes), humanBytes(s.maxSlotLag), s.lagCauseLocked())
	}
	if st := s.wm.Stats(); !st.OldestUnacked.IsZero() && time.Since(st.OldestUnacked) > stalledAfter {
		return false, fmt.Sprintf("watermark stalled: %d events unacked for %s", st.InflightEvents, time.Since(st.OldestUnacked).Round(time.Second))
	}
	return true, "streaming"
}

func (s *state) errSuffix() string {
	if s.lastErr == "" {
		return ""
	}
	return fmt.Sprintf(" (last error %s ago: %s)", time.Since(s.lastErrAt).Round(time.Second), s.lastErr)
}

// lagCause guesses why the slot lags, for the lag warning.
func (s *state) lagCause() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lagCauseLocked()
}

func (s *state) lagCauseLocked() string {
	switch {
	case !s.streaming:
		return "outboxd is not streaming" + s.errSuffix()
	case !s.kafkaOK:
		return "kafka is unreachable; events wait unacked"
	}
	if s.wm != nil {
		if st := s.wm.Stats(); !st.OldestUnacked.IsZero() && time.Since(st.OldestUnacked) > 10*time.Second {
			return fmt.Sprintf("%d events unacked by Kafka for %s", st.InflightEvents, time.Since(st.OldestUnacked).Round(time.Second))
		}
	}
	if s.lastErr != "" && time.Since(s.lastErrAt) < 5*time.Minute {
		return "recent error: " + s.lastErr
	}
	return "outboxd is catching up with a backlog"
}

// status is the /status document.
func (s *state) status() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]any{
		"slot":             s.slotName,
		"plugin":           s.slotInfo.Plugin,
		"streaming":        s.streaming,
		"kafka_reachable":  s.kafkaOK,
		"received_lsn":     s.received.String(),
		"confirmed_lsn":    s.confirmed.String(),
		"slot_server_view": s.slot,
		"last_error":       s.lastErr,
	}
	if len(s.topicHolds) > 0 {
		held := make(map[string]string, len(s.topicHolds))
		for t, why := range s.topicHolds {
			held[t] = why
		}
		out["held_topics"] = held
	}
	if !s.lastErrAt.IsZero() {
		out["last_error_at"] = s.lastErrAt.UTC().Format(time.RFC3339)
	}
	if s.wm != nil {
		st := s.wm.Stats()
		out["acked_lsn"] = st.Confirmed.String()
		out["inflight_events"] = st.InflightEvents
		out["inflight_bytes"] = st.InflightBytes
		out["open_transactions"] = st.OpenTxns
		if !st.OldestUnacked.IsZero() {
			out["oldest_unacked_age_seconds"] = time.Since(st.OldestUnacked).Seconds()
		}
	}
	return out
}
