package inbox

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Consumer's series, named outboxd_inbox_* after outboxd's
// own (metrics.go of the root package: outboxd_<subsystem>_<what>_<unit>) so
// that one dashboard and one alert file cover both halves of the pattern.
// Every series has a consumer label (Config.Name): one process may run
// several consumers on one registry.
type metrics struct {
	processed  *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	parked     *prometheus.CounterVec
	errors     *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	lag        *prometheus.GaugeVec
	held       *prometheus.GaugeVec
	retained   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	tp := []string{"consumer", "topic", "partition"}
	m := &metrics{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_inbox_events_processed_total",
			Help: "Events whose effect was applied (handler ran and its transaction committed)."}, tp),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_inbox_events_duplicate_total",
			Help: "Events skipped because their inbox row already existed (applied before: a redelivery)."}, tp),
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_inbox_events_parked_total",
			Help: "Poison events parked (inbox_parked or the dead-letter topic) after MaxAttempts handler failures."}, tp),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_inbox_handler_errors_total",
			Help: "Handler attempts that failed (the transaction rolled back)."}, tp),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outboxd_inbox_handler_duration_seconds",
			Help: "Time spent in the handler per applied event.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"consumer"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_inbox_lag_records",
			Help: "Records in the partition after the last applied one (high watermark of the last fetch minus next offset)."}, tp),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_inbox_held_partitions",
			Help: "Partitions held at a poison event (OnPoison: Hold)."}, []string{"consumer"}),
		retained: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_inbox_rows_expired_total",
			Help: "Inbox rows deleted by retention."}, []string{"consumer"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	for _, r := range []func() error{
		func() error { m.processed, err = register(reg, m.processed); return err },
		func() error { m.duplicates, err = register(reg, m.duplicates); return err },
		func() error { m.parked, err = register(reg, m.parked); return err },
		func() error { m.errors, err = register(reg, m.errors); return err },
		func() error { m.latency, err = register(reg, m.latency); return err },
		func() error { m.lag, err = register(reg, m.lag); return err },
		func() error { m.held, err = register(reg, m.held); return err },
		func() error { m.retained, err = register(reg, m.retained); return err },
	} {
		if err := r(); err != nil {
			return nil, fmt.Errorf("inbox: registering metrics: %w", err)
		}
	}
	return m, nil
}

// register registers c, or returns the collector already registered under its
// name: a second consumer on the same registry shares the vectors (its series
// differ by the consumer label).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// partitionMetrics are one partition's children of the vectors.
type partitionMetrics struct {
	processed, duplicates, parked, errors prometheus.Counter
	latency                               prometheus.Observer
	lag                                   prometheus.Gauge
	held                                  prometheus.Gauge
}

func (m *metrics) partition(consumer, topic string, part int32) *partitionMetrics {
	l := prometheus.Labels{"consumer": consumer, "topic": topic, "partition": strconv.Itoa(int(part))}
	return &partitionMetrics{
		processed:  m.processed.With(l),
		duplicates: m.duplicates.With(l),
		parked:     m.parked.With(l),
		errors:     m.errors.With(l),
		latency:    m.latency.WithLabelValues(consumer),
		lag:        m.lag.With(l),
		held:       m.held.WithLabelValues(consumer),
	}
}

// forget drops a revoked partition's lag: another member reports it now.
func (m *metrics) forget(consumer, topic string, part int32) {
	m.lag.Delete(prometheus.Labels{"consumer": consumer, "topic": topic, "partition": strconv.Itoa(int(part))})
}
