package outboxd

import "github.com/prometheus/client_golang/prometheus"

// MustRegister adds collectors to the relay's /metrics: the series of what
// the caller wraps around it, such as sink/otel's span export counts.
func (r *Relay) MustRegister(cs ...prometheus.Collector) { r.m.reg.MustRegister(cs...) }
