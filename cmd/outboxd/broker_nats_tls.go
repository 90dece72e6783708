package main

import (
	"context"

	"github.com/outboxd/outboxd/router"
)

// tls:// is nats.go's scheme for NATS over TLS (nats://, with the
// --nats-tls-* flags, upgrades to TLS as well when the server requires
// it): the same broker and flags as nats://.
func init() {
	registerBroker("tls", brokerKind{name: "NATS JetStream over TLS", system: "nats", cloudEvents: router.CENATS,
		options: func() brokerOptions { return natsTLSAlias{} }})
}

type natsTLSAlias struct{}

func (natsTLSAlias) register(*optionSet) {}

func (natsTLSAlias) validate(o *runOptions) error { return o.BrokerOpts["nats"].validate(o) }

func (natsTLSAlias) open(ctx context.Context, b brokerRun) (*openedBroker, error) {
	return b.Opts.BrokerOpts["nats"].open(ctx, b)
}
