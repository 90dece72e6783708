package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// deploy/README's Kafka security claims in one broker: SCRAM-SHA-256 over
// mutual TLS, the broker's certificate valid only for a DNS name that is not
// the dialed host (so --kafka-tls-server-name must be used), and a password
// file that wins over OUTBOXD_KAFKA_SASL_PASSWORD (set to a wrong password:
// were the environment used, authentication would fail).
func TestKafkaSCRAM256MutualTLSServerName(t *testing.T) {
	if os.Getenv(harness.EnvKafka) != "" {
		t.Skip("needs a harness-started broker with SASL and mutual TLS")
	}
	const (
		name   = "kafka.outboxd.test"
		secret = "scr4m-256-right"
		wrong  = "env-password-wrong"
	)
	dir := t.TempDir()
	ca, err := harness.NewTestCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, err := ca.Server("broker", []string{name}) // no IP: 127.0.0.1 does not verify
	if err != nil {
		t.Fatal(err)
	}
	cliCert, cliKey, err := ca.Client("relay")
	if err != nil {
		t.Fatal(err)
	}
	k := harness.KafkaForTest(t, harness.WithSASL("SCRAM-SHA-256", "relay", secret), harness.WithTLS(srvCert, srvKey),
		harness.WithTLSTrust(ca.CertFile, name), harness.WithClientAuth(ca.CertFile, cliCert, cliKey))

	// The broker really requires what is being tested: a client without a
	// certificate, and one verifying the dialed host, are both refused.
	opts, err := k.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	noCert := tlsProbe(t, ca.CertFile, name, "", "")
	noName := tlsProbe(t, ca.CertFile, "", cliCert, cliKey)
	if err := metadataProbe(t, opts); err != nil {
		t.Fatalf("the harness client (certificate, server name, SCRAM-SHA-256) is refused: %v", err)
	}
	if err := metadataProbe(t, append(opts, noCert)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without a certificate: %v; want the broker's TLS alert (mutual TLS)", err)
	} else {
		t.Logf("without a client certificate: %v", err)
	}
	if err := metadataProbe(t, append(opts, noName)); err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("a client verifying 127.0.0.1: %v; want a certificate error naming 127.0.0.1 (valid for %s only)", err, name)
	} else {
		t.Logf("verifying the dialed host: %v", err)
	}

	f := newFixture(t, withKafka(k))
	pf := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pf, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.env = []string{"OUTBOXD_KAFKA_SASL_PASSWORD=" + wrong}
	r := f.startRelay("--kafka-tls-ca", ca.CertFile, "--kafka-tls-cert", cliCert, "--kafka-tls-key", cliKey,
		"--kafka-tls-server-name", name, "--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-user", "relay",
		"--kafka-sasl-password-file", pf)
	end := f.commit(event{1, "secure-1", "E", `{"mtls": true}`})
	f.waitConfirmed(end, 30*time.Second)
	recs := f.records()
	if len(recs) != 1 || string(recs[0].Value) != `{"mtls": true}` {
		t.Fatalf("records %v", recs)
	}
	if id, _ := header(recs[0], "id"); id != eventID(1) {
		t.Errorf("id header %q, want %s", id, eventID(1))
	}
	if log := r.Log(); strings.Contains(log, secret) || strings.Contains(log, wrong) {
		t.Fatal("a SASL password appears in the log")
	}
	r.stop(t, f.ctx)
}

// tlsProbe is a TLS dial option trusting caFile for serverName ("" is the
// dialed host), presenting cert/key when given.
func tlsProbe(t *testing.T, caFile, serverName, cert, key string) kgo.Opt {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", caFile)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if cert != "" {
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return kgo.DialTLSConfig(cfg)
}

// metadataProbe asks the broker for metadata within 6 s.
func metadataProbe(t *testing.T, opts []kgo.Opt) error {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.RequestRetries(0))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	_, err = kadm.NewClient(cl).BrokerMetadata(ctx)
	return err
}
