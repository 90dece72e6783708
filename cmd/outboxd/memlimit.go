package main

import (
	"log/slog"

	"github.com/outboxd/outboxd/internal/memlimit"
)

// setMemoryLimit gives the Go runtime a soft memory limit just under the
// container's cgroup limit (unless GOMEMLIMIT is set), so that the heap's
// growth between collections cannot get outboxd OOM-killed at the in-flight
// bounds. Without a cgroup limit it sets memlimit.ForInflight(--max-inflight-
// bytes), which holds the defaults within 64 MiB of RSS (issue 34). It logs
// what it did once.
func setMemoryLimit(log *slog.Logger, getenv func(string) string, inflightBytes int64) {
	r := memlimit.Set(getenv, memlimit.ForInflight(inflightBytes))
	if r.Limit > 0 {
		log.Info(r.String(), "limit_bytes", r.Limit, "cgroup_limit_bytes", r.Cgroup)
		return
	}
	log.Debug(r.String())
}
