package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/sink/rabbitmq"
)

// amqp:// and amqps:// are one broker with one set of flags: amqps only
// points at amqp's options.
func init() {
	registerBroker("amqp", brokerKind{name: "RabbitMQ", system: "rabbitmq", cloudEvents: router.CEAMQP,
		options: func() brokerOptions { return &rabbitOptions{} }})
	registerBroker("amqps", brokerKind{name: "RabbitMQ over TLS", system: "rabbitmq", cloudEvents: router.CEAMQP,
		options: func() brokerOptions { return amqpsAlias{} }})
}

// rabbitOptions are the --rabbitmq-* flags (sink/rabbitmq, docs/rabbitmq.md).
type rabbitOptions struct {
	Exchange        string
	ExchangeType    string
	DeclareExchange bool
	KeyRouting      bool
	MaxMessageSize  byteSize
	ProgressQueue   string
	ManagementURL   string
	TLSCA           string
	TLSCert         string
	TLSKey          string
}

func (r *rabbitOptions) register(s *optionSet) {
	fs := s.fs
	fs.StringVar(&r.Exchange, "rabbitmq-exchange", rabbitmq.DefaultExchange, "exchange every event is published to; the routing key is the routed topic (outbox.event.<aggregatetype>)")
	fs.StringVar(&r.ExchangeType, "rabbitmq-exchange-type", "topic", "type of the exchange outboxd declares (topic, direct, fanout, headers)")
	fs.BoolVar(&r.DeclareExchange, "rabbitmq-declare-exchange", true, "declare the exchange (durable) when it is missing; false: a missing exchange holds the relay until someone declares it")
	fs.BoolVar(&r.KeyRouting, "rabbitmq-key-in-routing-key", false, "routing key <topic>.<key> instead of <topic>, so a binding can select one aggregate (the key is always in the outboxd.key header)")
	r.MaxMessageSize = rabbitmq.DefaultMaxMessageBytes
	fs.Var(&r.MaxMessageSize, "rabbitmq-max-message-size", "the server's max_message_size (RabbitMQ 3.x: 128MiB, 4.x: 16MiB): a larger event is invalid (--on-invalid) before it is sent; --max-message-bytes bounds events too")
	fs.StringVar(&r.ProgressQueue, "rabbitmq-progress-queue", "outboxd.progress", "prefix of the durable queue holding the progress record (<prefix>.<system id>/<slot>, one message): it outlives the slot, so a lost slot is reported as a gap")
	fs.StringVar(&r.ManagementURL, "rabbitmq-management-url", "", "management plugin's HTTP API, to check at startup that the queues bound to the exchange are quorum queues (a classic queue can lose confirmed events); empty: http://<--broker host>:15672 with --broker's user; off: no check")
	fs.StringVar(&r.TLSCA, "rabbitmq-tls-ca", "", "CA file to verify the server of an amqps:// URL with (default: the system's)")
	fs.StringVar(&r.TLSCert, "rabbitmq-tls-cert", "", "client certificate for amqps://, with --rabbitmq-tls-key")
	fs.StringVar(&r.TLSKey, "rabbitmq-tls-key", "", "client key for amqps://")
}

func (r *rabbitOptions) validate(o *runOptions) error {
	var errs []error
	if o.ExactlyOnce {
		errs = append(errs, fmt.Errorf("--exactly-once: %w; remove --exactly-once", rabbitmq.ErrExactlyOnce))
	}
	switch r.ExchangeType {
	case "topic", "direct", "fanout", "headers":
	default:
		errs = append(errs, fmt.Errorf("--rabbitmq-exchange-type %q: one of topic, direct, fanout, headers", r.ExchangeType))
	}
	if r.Exchange == "" {
		errs = append(errs, errors.New("--rabbitmq-exchange is empty: the default exchange routes by queue name only; name an exchange"))
	}
	if r.ProgressQueue == "" || strings.HasPrefix(r.ProgressQueue, "amq.") {
		errs = append(errs, errors.New("--rabbitmq-progress-queue must be a queue name that does not start with amq. (reserved)"))
	}
	if (r.TLSCert == "") != (r.TLSKey == "") {
		errs = append(errs, errors.New("--rabbitmq-tls-cert and --rabbitmq-tls-key go together"))
	}
	return errors.Join(errs...)
}

func (r *rabbitOptions) tlsConfig() (*tls.Config, error) {
	if r.TLSCA == "" && r.TLSCert == "" {
		return nil, nil // amqps: the system roots
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.TLSCA != "" {
		pem, err := os.ReadFile(r.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--rabbitmq-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--rabbitmq-tls-ca %s: no PEM certificate in it", r.TLSCA)
		}
	}
	if r.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(r.TLSCert, r.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--rabbitmq-tls-cert/--rabbitmq-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func (r *rabbitOptions) open(ctx context.Context, b brokerRun) (*openedBroker, error) {
	tlsCfg, err := r.tlsConfig()
	if err != nil {
		return nil, err
	}
	cfg := rabbitmq.Config{
		URL: b.URL, TLS: tlsCfg, Exchange: r.Exchange, ExchangeType: r.ExchangeType, Declare: r.DeclareExchange,
		KeyInRoutingKey: r.KeyRouting, MaxMessageBytes: int(r.MaxMessageSize), Logger: b.Log, Held: b.Held,
	}
	sk, err := rabbitmq.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("--broker %s: %w", redactBrokerURL(b.URL), err)
	}
	if r.ManagementURL != "off" {
		r.checkQueues(ctx, b, tlsCfg)
	}
	// The store holds a connection of its own, closed with the sink's.
	var (
		mu    sync.Mutex
		store *rabbitmq.ProgressStore
	)
	progress := func(key string) sink.ProgressStore {
		mu.Lock()
		defer mu.Unlock()
		if store == nil {
			store = rabbitmq.NewProgressStore(cfg, r.ProgressQueue, key)
		}
		return store
	}
	closeAll := func() {
		sk.Close()
		mu.Lock()
		if store != nil {
			store.Close()
		}
		mu.Unlock()
	}
	return &openedBroker{Sink: sk, NewProgress: progress, Close: closeAll}, nil
}

// checkQueues asks the management API, in the background, for the queues
// bound to the exchange, and reports those that can lose what they
// confirmed (sink/rabbitmq/durability.go). Without the API (the plugin off,
// another port) it says so at Info: AMQP cannot tell.
func (r *rabbitOptions) checkQueues(ctx context.Context, b brokerRun, tlsCfg *tls.Config) {
	m, err := rabbitmq.NewManagement(r.ManagementURL, b.URL)
	if err != nil {
		return // --broker does not parse: rabbitmq.New says so
	}
	m.Client = &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment}}
	go func() { // owned by open: ends within its timeout
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := m.Check(ctx, r.Exchange, b.Durability)
		if err != nil {
			b.Log.Info("rabbitmq: could not check the queues bound to the exchange (quorum or classic) through the management API; set --rabbitmq-management-url, or off", "exchange", r.Exchange, "url", m.URL, "err", err)
			return
		}
		b.Log.Info("rabbitmq: checked the queues bound to the exchange", "exchange", r.Exchange, "queues", n)
	}()
}

// amqpsAlias is amqps://: the same broker and flags as amqp://.
type amqpsAlias struct{}

func (amqpsAlias) register(*optionSet) {}

func (amqpsAlias) validate(o *runOptions) error { return o.BrokerOpts["amqp"].validate(o) }

func (amqpsAlias) open(ctx context.Context, b brokerRun) (*openedBroker, error) {
	return b.Opts.BrokerOpts["amqp"].open(ctx, b)
}
