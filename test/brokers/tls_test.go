package brokers

import (
	"fmt"
	"net"
	"testing"

	"github.com/outboxd/outboxd/test/harness"
)

// tlsCA is a throwaway CA with a server certificate for 127.0.0.1.
func tlsCA(t *testing.T) (ca *harness.TestCA, cert, key string) {
	t.Helper()
	ca, err := harness.NewTestCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if cert, key, err = ca.Server("broker", nil, net.ParseIP("127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	return ca, cert, key
}

// The routing test over TLS to a nats-server that requires it: outboxd
// connects with tls:// and verifies the server with --nats-tls-ca.
func TestNATSTLS(t *testing.T) {
	ca, cert, key := tlsCA(t)
	b := &natsBroker{srv: harness.NATSForTest(t, harness.WithNATSTLS(cert, key, ca.CertFile))}
	f := newFixture(t, b)
	f.via = []string{"--broker", b.srv.URL(), "--nats-tls-ca", ca.CertFile}
	testRouting(t, f)
}

// The routing test over TLS to RabbitMQ's TLS listener: outboxd connects
// with amqps:// and verifies the server with --rabbitmq-tls-ca.
func TestRabbitMQTLS(t *testing.T) {
	ca, cert, key := tlsCA(t)
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	node := harness.RabbitMQForTest(t,
		fmt.Sprintf("listeners.ssl.1 = 127.0.0.1:%d", port),
		"ssl_options.cacertfile = "+ca.CertFile,
		"ssl_options.certfile = "+cert,
		"ssl_options.keyfile = "+key,
		"ssl_options.verify = verify_none",
		"ssl_options.fail_if_no_peer_cert = false")
	b := newRabbitBroker(t, node, "#")
	f := newFixture(t, b)
	f.via = []string{"--broker", fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/", port), "--rabbitmq-exchange", b.exchange, "--rabbitmq-tls-ca", ca.CertFile}
	testRouting(t, f)
}
