package outboxd

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outboxd/slot"
)

// metrics are outboxd's Prometheus series. Their names are a public contract
// (docs/operations.md, deploy/grafana, deploy/prometheus): rename nothing.
type metrics struct {
	reg *prometheus.Registry

	slotLag         prometheus.Gauge
	slotRetained    prometheus.Gauge
	slotSafeWAL     prometheus.Gauge
	slotWALStatus   *prometheus.GaugeVec
	confirmedLSN    prometheus.Gauge
	receivedLSN     prometheus.Gauge
	published       *prometheus.CounterVec
	skipped         *prometheus.CounterVec
	transactions    prometheus.Counter
	produceErrors   prometheus.Counter
	reconnects      *prometheus.CounterVec
	publishLatency  prometheus.Histogram
	connected       prometheus.Gauge
	replDelay       prometheus.Gauge
	deadLettered    prometheus.Counter
	heartbeatErrors prometheus.Counter
	blocked         prometheus.Gauge
	// unprotectedStandbys: physical standbys missing from synchronized_standby_slots (standbys.go).
	unprotectedStandbys prometheus.Gauge
}

func newMetrics(version string, st *state) *metrics {
	reg := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	g := func(name, help string) prometheus.Gauge {
		m := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		f(m)
		return m
	}
	m := &metrics{reg: reg}
	m.slotLag = g("outboxd_slot_lag_bytes", "pg_current_wal_lsn() - confirmed_flush_lsn of the slot.")
	m.slotRetained = g("outboxd_slot_retained_wal_bytes", "pg_current_wal_lsn() - restart_lsn of the slot: WAL the server keeps for it.")
	m.slotSafeWAL = g("outboxd_slot_safe_wal_size_bytes", "safe_wal_size of the slot: bytes that can still be written before the slot is lost (-1 when unlimited).")
	m.slotWALStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_slot_wal_status", Help: "1 for the slot's current wal_status (reserved, extended, unreserved, lost)."}, []string{"status"})
	f(m.slotWALStatus)
	m.confirmedLSN = g("outboxd_confirmed_flush_lsn", "Last LSN confirmed to PostgreSQL, as a number.")
	m.receivedLSN = g("outboxd_received_lsn", "Newest WAL position received from the server, as a number.")
	m.published = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_events_published_total", Help: "Events acked by the broker, by topic."}, []string{"topic"})
	f(m.published)
	m.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_events_skipped_total", Help: "Rows not published, by reason (update, delete, truncate, invalid, ...)."}, []string{"reason"})
	f(m.skipped)
	m.transactions = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_transactions_total", Help: "Committed transactions decoded from the slot."})
	f(m.transactions)
	m.produceErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_kafka_produce_errors_total", Help: "Records the broker rejected or failed to ack (any broker; the name is kept from when Kafka was the only one)."})
	f(m.produceErrors)
	m.reconnects = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_reconnects_total", Help: "Reconnections, by target (postgres, and the broker: kafka, nats, rabbitmq)."}, []string{"target"})
	f(m.reconnects)
	m.reconnects.WithLabelValues("postgres") // present at 0 from the start, so rate() works; the broker's: New
	m.publishLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "outboxd_publish_latency_seconds",
		Help:    "Time from the transaction's commit to the broker's ack of its event.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	})
	f(m.publishLatency)
	// Read from the watermark at scrape time: always current, no hot-path cost.
	gf := func(name, help string, fn func(slot.Stats) float64) {
		f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			wm, _ := st.session()
			if wm == nil {
				return 0
			}
			return fn(wm.Stats())
		}))
	}
	gf("outboxd_acked_lsn", "Newest LSN up to which the broker has acked every event, as a number.",
		func(s slot.Stats) float64 { return float64(s.Confirmed) })
	gf("outboxd_inflight_events", "Events handed to the broker and not yet acked.",
		func(s slot.Stats) float64 { return float64(s.InflightEvents) })
	gf("outboxd_inflight_bytes", "Bytes of events handed to the broker and not yet acked.",
		func(s slot.Stats) float64 { return float64(s.InflightBytes) })
	gf("outboxd_oldest_unacked_age_seconds", "Age of the oldest transaction not yet fully acked (0 when none).",
		func(s slot.Stats) float64 {
			if s.OldestUnacked.IsZero() {
				return 0
			}
			return time.Since(s.OldestUnacked).Seconds()
		})
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outboxd_active", Help: "1 while this instance streams from the slot (the active); 0 on a standby. Alert on the maximum over instances."}, st.isActive))
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outboxd_broker_reachable", Help: "1 while the broker answers the monitor's ping (every --poll-interval), 0 while it does not: the series to alert on for a broker outage (produce errors stay 0 while the client retries)."}, st.brokerReachable))
	m.connected = g("outboxd_replication_connected", "1 while streaming from the slot.")
	m.replDelay = g("outboxd_replication_delay_seconds", "Time from emitting a heartbeat message to receiving it from the slot.")
	m.deadLettered = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_events_dead_lettered_total", Help: "Rows published to the dead-letter topic."})
	f(m.deadLettered)
	m.heartbeatErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_heartbeat_errors_total", Help: "Heartbeat messages that could not be written."})
	f(m.heartbeatErrors)
	m.blocked = g("outboxd_blocked", "1 while the relay holds on an event it may not pass (on-invalid = fail, or table.op.invalid.behavior = fatal).")
	m.unprotectedStandbys = g("outboxd_unprotected_standbys", "Physical standbys streaming through a slot that synchronized_standby_slots does not name (PostgreSQL 17+, failover slot): promoting one may leave events in the broker that the new primary never had.")
	bi := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_build_info", Help: "Build information."}, []string{"version"})
	bi.WithLabelValues(version).Set(1)
	f(bi)
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every labelled series known in advance exists at 0 from the start, so
	// rate() and dashboards have a series before the first event; a topic's
	// outboxd_events_published_total appears with the topic's first ack.
	for _, reason := range []string{"update", "delete", "truncate", "invalid", "ignored_table", "replayed"} {
		m.skipped.WithLabelValues(reason)
	}
	return m
}
