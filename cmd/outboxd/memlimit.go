package main

import (
	"flag"
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

// lowerInflightDefault sets --max-inflight-events to n for a broker whose
// in-flight events cost more than Kafka's, when the flag was left at its
// default (fs: run's flags; nil: nothing to check) and the default is
// larger. why goes to the log line saying so.
func lowerInflightDefault(fs *flag.FlagSet, b brokerRun, n int, why string) {
	if fs == nil {
		return
	}
	if f := fs.Lookup("max-inflight-events"); f != nil && f.Value.String() == f.DefValue && b.Opts.MaxInflightEvents > n {
		b.Opts.MaxInflightEvents = n
		b.Log.Info(why+"; set --max-inflight-events to hold more", "max_inflight_events", n)
	}
}
