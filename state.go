package outboxd

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/humanize"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/sink"
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
	brokerOK   bool      // the sink answered its last Ping
	received   wal.LSN
	confirmed  wal.LSN // last flush position sent to the server
	lastErr    string
	lastErrAt  time.Time
	stalled    string   // why the relay holds on an event it may not pass
	warnings   []string // insecure settings, set at startup
	holder     string   // who holds the slot while this instance stands by (role.go)
	// unprotected: physical standby slots synchronized_standby_slots lacks (standbys.go).
	unprotected []string
	topicHolds  map[string]string // topics whose events the sink holds, and why
	// heartbeatErr: why heartbeats fail ("" while they work; monitor.go).
	heartbeatErr string
	// starting: what Run's startup waits for ("" once it streams or
	// stands by); waitingForBroker once the broker has failed to answer.
	starting         string
	waitingForBroker bool
	// checkpointWait: what holds the checkpoint partition's last stable
	// offset below its end (nil: nothing; checkpointwait.go).
	checkpointWait *sink.CheckpointWait
}

// session is the current session's watermark (nil before the first) and
// the slot as read when it started.
func (s *state) session() (*slot.Watermark, slot.Info) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wm, s.slotInfo
}

// slotView is the slot as the monitor last polled it.
func (s *state) slotView() slotView {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slot
}

// setUnprotected records the physical standbys synchronized_standby_slots
// lacks, and reports whether the list changed.
func (s *state) setUnprotected(slots []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := !slices.Equal(s.unprotected, slots)
	s.unprotected = slots
	return changed
}

// setBrokerOK records the outcome of the monitor's Ping.
func (s *state) setBrokerOK(ok bool) {
	s.mu.Lock()
	s.brokerOK = ok
	s.mu.Unlock()
}

// setSlotView records the slot as the monitor last polled it.
func (s *state) setSlotView(v slotView) {
	s.mu.Lock()
	s.slot = v
	s.mu.Unlock()
}

// setStarting records what Run's startup waits for ("" when done).
func (s *state) setStarting(why string, waitingForBroker bool) {
	s.mu.Lock()
	s.starting, s.waitingForBroker = why, waitingForBroker
	s.mu.Unlock()
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
	if busy := (*slot.BusyError)(nil); !errors.As(err, &busy) {
		s.holder = "" // not a standby: the session failed for another reason
	}
	s.lastErr, s.lastErrAt = redact.String(err.Error(), s.dsn), time.Now()
	s.mu.Unlock()
}

// ready reports whether outboxd is doing its job, and if not, why.
func (s *state) ready() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.starting != "":
		return false, "starting: " + s.starting + s.checkpointWaitSuffix()
	case s.stalled != "":
		return false, s.stalled
	case len(s.topicHolds) > 0:
		return false, s.topicHoldLocked()
	case s.roleLocked() == roleStandby && s.brokerOK:
		return true, fmt.Sprintf("%s: slot %s is held by %s; taking over when it lets go", roleStandby, s.slotName, s.holder)
	case !s.streaming:
		return false, "not streaming from the replication slot" + s.checkpointWaitSuffix() + s.errSuffix()
	case !s.brokerOK:
		return false, "broker unreachable" + s.errSuffix()
	case s.maxSlotLag > 0 && s.slot.LagBytes > s.maxSlotLag:
		return false, fmt.Sprintf("slot lag %s above --max-slot-lag %s: %s", humanize.Bytes(s.slot.LagBytes), humanize.Bytes(s.maxSlotLag), s.lagCauseLocked())
	}
	if st := s.wm.Stats(); !st.OldestUnacked.IsZero() && time.Since(st.OldestUnacked) > stalledAfter {
		return false, fmt.Sprintf("watermark stalled: %d events unacked for %s", st.InflightEvents, time.Since(st.OldestUnacked).Round(time.Second))
	}
	if s.heartbeatErr != "" {
		return true, "streaming; " + s.heartbeatErr // delivery goes on: ready, with the reason
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
	case !s.brokerOK:
		return "the broker is unreachable; events wait unacked"
	}
	if s.wm != nil {
		if st := s.wm.Stats(); !st.OldestUnacked.IsZero() && time.Since(st.OldestUnacked) > 10*time.Second {
			return fmt.Sprintf("%d events unacked by the broker for %s", st.InflightEvents, time.Since(st.OldestUnacked).Round(time.Second))
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
	if s.starting != "" {
		// Before the relay streams: what it waits for. waiting_for_kafka
		// keeps its name: scripts and the tests read it (docs/operations.md).
		out := map[string]any{"role": roleInactive, "streaming": false, "starting": s.starting, "waiting_for_kafka": s.waitingForBroker}
		if s.checkpointWait != nil {
			out["checkpoint_wait"] = s.checkpointWait
		}
		return out
	}
	out := map[string]any{
		"slot":             s.slotName,
		"role":             s.roleLocked(),
		"failover":         s.slotInfo.Failover || s.slot.Failover,
		"plugin":           s.slotInfo.Plugin,
		"streaming":        s.streaming,
		"broker_reachable": s.brokerOK,
		"kafka_reachable":  s.brokerOK, // the same, under its name from before NATS and RabbitMQ
		"received_lsn":     s.received.String(),
		"confirmed_lsn":    s.confirmed.String(),
		"slot_server_view": s.slot,
		"last_error":       s.lastErr,
	}
	if len(s.warnings) > 0 {
		out["security_warnings"] = s.warnings
	}
	if len(s.unprotected) > 0 {
		out["unprotected_standbys"] = s.unprotected
		out["warning"] = "physical standbys stream through slots that synchronized_standby_slots does not name (" + strings.Join(s.unprotected, ", ") +
			"): after a promotion the broker may hold events the new primary never had; add them to synchronized_standby_slots on the primary"
	}
	if s.holder != "" && !s.streaming {
		out["slot_holder"] = s.holder
	}
	if s.heartbeatErr != "" {
		out["heartbeat_error"] = s.heartbeatErr
	}
	if s.checkpointWait != nil {
		out["checkpoint_wait"] = s.checkpointWait
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

// startSession records a session that started streaming with wm.
func (s *state) startSession(wm *slot.Watermark, info slot.Info) {
	s.mu.Lock()
	s.wm, s.streaming, s.slotInfo = wm, true, info
	s.mu.Unlock()
}

// endSession records that the replication connection is gone.
func (s *state) endSession() {
	s.mu.Lock()
	s.streaming = false
	s.mu.Unlock()
}

// setStalled records why the relay holds before an event ("" when it no
// longer does).
func (s *state) setStalled(reason string) {
	s.mu.Lock()
	s.stalled = redact.String(reason, s.dsn)
	s.mu.Unlock()
}

// setPositions records the flush position last sent and the WAL received.
func (s *state) setPositions(confirmed, received wal.LSN) {
	s.mu.Lock()
	s.confirmed, s.received = confirmed, received
	s.mu.Unlock()
}

// setHeartbeatErr records why heartbeats fail ("" when they work) and
// returns the previous reason.
func (s *state) setHeartbeatErr(why string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.heartbeatErr
	s.heartbeatErr = why
	return prev
}

// setStandby records who holds the slot; nil clears it.
func (s *state) setStandby(busy *slot.BusyError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holder = ""
	if busy != nil {
		s.holder = fmt.Sprintf("PID %d", busy.PID)
		if busy.Holder != "" {
			s.holder += " (" + busy.Holder + ")"
		}
	}
}

// roleLocked derives the role; s.mu is held.
func (s *state) roleLocked() role {
	switch {
	case s.streaming:
		return roleActive
	case s.holder != "":
		return roleStandby
	}
	return roleInactive
}

// isActive is the outboxd_active metric: 1 while this instance streams.
// brokerReachable is outboxd_broker_reachable: 1 when the broker answered
// the monitor's last Ping. It moves in an outage, where the producer's own
// retries keep outboxd_kafka_produce_errors_total at 0.
func (s *state) brokerReachable() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.brokerOK {
		return 1
	}
	return 0
}

func (s *state) isActive() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.roleLocked() == roleActive {
		return 1
	}
	return 0
}

// hasTopicHolds reports whether the sink holds any topic's events.
func (s *state) hasTopicHolds() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.topicHolds) > 0
}
