package main

import (
	"net/url"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/router"
)

// cloudEventsOptions are the CloudEvents envelope's flags (router/cloudevents.go,
// docs/cloudevents.md); the per-table router options envelope,
// cloudevents.mode and cloudevents.source override them.
type cloudEventsOptions struct {
	Envelope string
	Mode     string
	Source   string
}

func (c *cloudEventsOptions) register(s *optionSet) {
	s.choice(&c.Envelope, "envelope", "none", "wrap every event: none, or cloudevents (CloudEvents 1.0 attributes as the broker's protocol binding names them: Kafka ce_*, NATS ce-*, AMQP cloudEvents:*); per table: the router option envelope", "none", "cloudevents")
	s.choice(&c.Mode, "cloudevents-mode", "binary", "with --envelope cloudevents: binary (attributes as headers, the payload as it is) or structured (the value is the JSON event format, application/cloudevents+json)", "binary", "structured")
	s.fs.StringVar(&c.Source, "cloudevents-source", "", "the CloudEvents source attribute (a URI reference); empty: /outboxd/<database>/<slot>")
}

// cloudEventsConfig is the router's CloudEvents configuration for o's broker.
func cloudEventsConfig(o runOptions) router.CloudEventsConfig {
	c := router.CloudEventsConfig{Envelope: o.CloudEvents.Envelope, Mode: o.CloudEvents.Mode, Source: o.CloudEvents.Source,
		Binding: brokerKindOf(o.Broker).cloudEvents}
	if c.Source == "" {
		db := ""
		if cfg, err := pgconn.ParseConfig(o.Postgres); err == nil {
			db = cfg.Database
		}
		c.Source = "/outboxd/" + url.PathEscape(db) + "/" + url.PathEscape(o.Slot)
	}
	return c
}
