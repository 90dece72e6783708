package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	natssink "github.com/outboxd/outboxd/sink/nats"
)

func init() {
	registerBroker("nats", brokerKind{name: "NATS JetStream", system: "nats", cloudEvents: router.CENATS,
		options: func() brokerOptions { return &natsOptions{} }})
}

// natsOptions are the --nats-* flags (sink/nats, docs/nats.md).
type natsOptions struct {
	CreateStreams   bool
	KeyToken        bool
	StreamReplicas  int
	DuplicateWindow time.Duration
	AckTimeout      time.Duration
	ProgressBucket  string
	Creds           string
	TLSCA           string
	TLSCert         string
	TLSKey          string
}

func (n *natsOptions) register(s *optionSet) {
	fs := s.fs
	fs.BoolVar(&n.CreateStreams, "nats-create-streams", true, "create a stream for a topic no stream captures (subjects <topic> and <topic>.>, file storage) before its first event; false: such an event is invalid (--on-invalid)")
	fs.BoolVar(&n.KeyToken, "nats-key-token", false, "publish to <topic>.<key> instead of <topic>, so consumers can filter one aggregate (the key is always in the Outboxd-Key header)")
	fs.IntVar(&n.StreamReplicas, "nats-stream-replicas", 1, "replicas of the streams and the progress bucket outboxd creates (3 on a cluster: a PubAck then means a quorum stored the event)")
	fs.DurationVar(&n.DuplicateWindow, "nats-duplicate-window", 2*time.Minute, "duplicate window of the streams outboxd creates: a replay after a restart within it is dropped by Nats-Msg-Id (the event id)")
	fs.DurationVar(&n.AckTimeout, "nats-ack-timeout", 30*time.Second, "a publish whose PubAck does not come within this (up to 1.25 times it) fails: outboxd reconnects, and the session replays it")
	fs.StringVar(&n.ProgressBucket, "nats-progress-bucket", "outboxd_progress", "JetStream key-value bucket holding the progress record (key <system id>/<slot>): it outlives the slot, so a lost slot is reported as a gap")
	fs.StringVar(&n.Creds, "nats-creds", "", "NATS credentials file (user JWT and NKey seed)")
	fs.StringVar(&n.TLSCA, "nats-tls-ca", "", "CA file to verify the NATS server with")
	fs.StringVar(&n.TLSCert, "nats-tls-cert", "", "client certificate for NATS TLS, with --nats-tls-key")
	fs.StringVar(&n.TLSKey, "nats-tls-key", "", "client key for NATS TLS")
}

// validBucket is JetStream's rule for key-value bucket names.
var validBucket = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

func (n *natsOptions) validate(o *runOptions) error {
	var errs []error
	if o.ExactlyOnce {
		errs = append(errs, errors.New("--exactly-once is Kafka's transactional producer and has no NATS equivalent: JetStream cannot commit "+
			"a batch of messages together with a checkpoint, so outboxd relays to NATS at least once; Nats-Msg-Id (the event id) makes "+
			"JetStream drop the replays of a restart within --nats-duplicate-window (see docs/nats.md). Remove --exactly-once"))
	}
	if n.StreamReplicas < 1 || n.StreamReplicas > 5 {
		errs = append(errs, errors.New("--nats-stream-replicas must be between 1 and 5"))
	}
	if n.DuplicateWindow <= 0 || n.AckTimeout <= 0 {
		errs = append(errs, errors.New("--nats-duplicate-window and --nats-ack-timeout must be positive"))
	}
	if !validBucket.MatchString(n.ProgressBucket) {
		errs = append(errs, fmt.Errorf("--nats-progress-bucket %q: a bucket name has only letters, digits, _ and -", n.ProgressBucket))
	}
	if (n.TLSCert == "") != (n.TLSKey == "") {
		errs = append(errs, errors.New("--nats-tls-cert and --nats-tls-key go together"))
	}
	return errors.Join(errs...)
}

func (n *natsOptions) open(_ context.Context, b brokerRun) (*openedBroker, error) {
	var opts []nats.Option
	if n.Creds != "" {
		opts = append(opts, nats.UserCredentials(n.Creds))
	}
	if n.TLSCA != "" {
		opts = append(opts, nats.RootCAs(n.TLSCA))
	}
	if n.TLSCert != "" {
		opts = append(opts, nats.ClientCert(n.TLSCert, n.TLSKey))
	}
	sk, err := natssink.New(natssink.Config{
		URL: b.URL, Options: opts, KeyToken: n.KeyToken,
		CreateStreams: n.CreateStreams, StreamReplicas: n.StreamReplicas, DuplicateWindow: n.DuplicateWindow,
		MaxPending: b.Opts.MaxInflightEvents + 1000, AckTimeout: n.AckTimeout, Logger: b.Log, Durability: b.Durability,
	})
	if err != nil {
		return nil, fmt.Errorf("--broker %s: %w", redactBrokerURL(b.URL), err)
	}
	if why := natssink.CreatedStreamsRisk(n.StreamReplicas); n.CreateStreams && why != "" {
		b.Durability("streams outboxd creates", why)
	}
	b.Log.Info("nats: " + natssink.SyncIntervalNote)
	progress := func(key string) sink.ProgressStore {
		return natssink.ProgressStore{Sink: sk, Bucket: n.ProgressBucket, Key: key, Replicas: n.StreamReplicas}
	}
	return &openedBroker{Sink: sk, NewProgress: progress, Close: sk.Close, Collectors: sk.Collectors()}, nil
}
