// Command kfaked runs a single-broker in-process fake Kafka cluster
// (github.com/twmb/franz-go/pkg/kfake) as a standalone process, so tests can
// stop, kill and restart "Kafka" like a real broker.
//
// It listens on 127.0.0.1 only, prints exactly one line
//
//	kfaked listening on 127.0.0.1:PORT
//
// to stdout once it accepts connections, and shuts down cleanly (persisting
// its state when -data-dir is set) on SIGINT or SIGTERM, exiting 0.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "kfaked: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		port       = flag.Int("port", 0, "port to listen on (0 picks a free port)")
		dataDir    = flag.String("data-dir", "", "persist state here; reloaded on start (survives a clean stop)")
		syncWrites = flag.Bool("sync-writes", false, "fsync every produced batch (only matters for OS crashes)")
		partitions = flag.Int("partitions", 3, "partitions of auto-created topics")
		autoCreate = flag.Bool("auto-create", true, "create a topic on a metadata request that asks for it (Kafka's auto.create.topics.enable)")
		saslUser   = flag.String("sasl-user", "", "enable SASL with this superuser")
		saslPass   = flag.String("sasl-pass", "", "password of -sasl-user")
		saslMech   = flag.String("sasl-mechanism", "PLAIN", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
		tlsCert    = flag.String("tls-cert", "", "server certificate PEM file (enables TLS)")
		tlsKey     = flag.String("tls-key", "", "server key PEM file")
		tlsCA      = flag.String("tls-client-ca", "", "require client certificates signed by this CA (PEM file): mutual TLS")
		logLevel   = flag.String("log-level", "none", "kfake log level on stderr: none, error, warn, info, debug")
	)
	flag.Parse()

	opts := []kfake.Opt{
		kfake.DefaultNumPartitions(*partitions),
		kfake.WithLogger(kfake.BasicLogger(os.Stderr, parseLevel(*logLevel))),
	}
	// Ports(0) means one broker on a random port; kfake always binds 127.0.0.1.
	if *autoCreate {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	opts = append(opts, kfake.Ports(*port))
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir))
	}
	if *syncWrites {
		opts = append(opts, kfake.SyncWrites())
	}
	if *saslUser != "" {
		mech := strings.ToUpper(*saslMech)
		switch mech {
		case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		default:
			return fmt.Errorf("unsupported -sasl-mechanism %q", *saslMech)
		}
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(mech, *saslUser, *saslPass))
	}
	if *tlsCert != "" || *tlsKey != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			return fmt.Errorf("loading TLS key pair: %w", err)
		}
		cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if *tlsCA != "" {
			pem, err := os.ReadFile(*tlsCA)
			if err != nil {
				return fmt.Errorf("-tls-client-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("-tls-client-ca: no PEM certificate in %s", *tlsCA)
			}
			cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
		opts = append(opts, kfake.TLS(cfg))
	}

	// Register for signals before announcing readiness so a signal sent
	// right after the "listening" line is never lost.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("starting cluster: %w", err)
	}
	fmt.Printf("kfaked listening on %s\n", cluster.ListenAddrs()[0])

	<-ctx.Done()
	cluster.Close() // persists state to -data-dir
	fmt.Fprintln(os.Stderr, "kfaked stopped")
	return nil
}

func parseLevel(s string) kfake.LogLevel {
	switch strings.ToLower(s) {
	case "error":
		return kfake.LogLevelError
	case "warn":
		return kfake.LogLevelWarn
	case "info":
		return kfake.LogLevelInfo
	case "debug":
		return kfake.LogLevelDebug
	default:
		return kfake.LogLevelNone
	}
}
