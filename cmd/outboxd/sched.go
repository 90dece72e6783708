package main

import (
	"errors"
	"log/slog"

	"github.com/outboxd/outboxd/internal/schedbatch"
)

// schedSwitch puts outboxd under SCHED_BATCH while a backlog drains and
// back under the default policy when the replication stream goes quiet
// (--sched-batch; internal/schedbatch says why). draining is the engine's
// Config.Draining: it runs in the goroutine that reads the stream, one
// session at a time, so the switch needs no lock.
type schedSwitch struct {
	log        *slog.Logger
	set, reset func() (schedbatch.Result, error) // schedbatch's; a test's stand-ins
	off        bool                              // a refusal: the default policy stays
}

// newSchedSwitch is nil where the switch does nothing: off Linux, or in a
// process started under a policy someone chose (chrt), which it keeps.
func newSchedSwitch(log *slog.Logger) *schedSwitch {
	def, err := schedbatch.Default()
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		log.Debug("SCHED_BATCH is Linux's: the default CPU scheduling policy stays")
		return nil
	case err != nil:
		log.Warn("cannot read the CPU scheduling policy; the default policy stays", "err", err)
		return nil
	case !def:
		log.Info("outboxd keeps the CPU scheduling policy it was started with (--sched-batch applies to the default policy only)")
		return nil
	}
	log.Info("CPU scheduling policy: SCHED_BATCH while a backlog drains, the default policy otherwise (--sched-batch)")
	return &schedSwitch{log: log, set: schedbatch.Set, reset: schedbatch.Reset}
}

func (s *schedSwitch) draining(on bool) {
	if s.off {
		return
	}
	set, state, name := s.reset, "quiet", "the default policy"
	if on {
		set, state, name = s.set, "draining", "SCHED_BATCH"
	}
	r, err := set()
	if err != nil {
		s.off = true
		_, _ = s.reset() // best effort: never stay half switched
		s.log.Warn("cannot switch the CPU scheduling policy; the default policy stays (more context switches per event while draining)",
			"err", err, "fix", "allow sched_setattr in the container's seccomp profile, or pass --sched-batch=false to skip it")
		return
	}
	s.log.Debug("replication stream "+state+": CPU scheduling policy "+name, "threads", r.Threads, "kept", r.Kept)
}
