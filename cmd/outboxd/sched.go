package main

import (
	"errors"
	"log/slog"

	"github.com/outboxd/outboxd/internal/schedbatch"
)

// setSchedBatch moves outboxd's threads to SCHED_BATCH (--sched-batch,
// internal/schedbatch says why) and logs what it did once. A refusal (a
// seccomp profile without sched_setattr) is a warning, not an error:
// outboxd works the same under the default policy, at more CPU per event.
func setSchedBatch(log *slog.Logger) {
	r, err := schedbatch.Set()
	switch {
	case err == nil:
		log.Info(r.String(), "threads", r.Threads, "kept", r.Kept)
	case errors.Is(err, errors.ErrUnsupported):
		log.Debug("SCHED_BATCH is Linux's: the default CPU scheduling policy stays")
	default:
		log.Warn("cannot run under the SCHED_BATCH CPU scheduling policy; the default policy stays (more CPU per event)",
			"err", err, "fix", "allow sched_setattr in the container's seccomp profile, or pass --sched-batch=false to skip it")
	}
}
