package harness

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRabbitMQPortTaken: a node whose AMQP, distribution or epmd port
// another process holds exits with what rabbitPortTaken knows, and
// startOnFreePorts, what StartRabbitMQ starts it with, then starts it
// again on new ports, the failed node's epmd stopped.
func TestRabbitMQPortTaken(t *testing.T) {
	if docker, _ := dockerBackend(); docker {
		t.Skip("the node is a process on the docker backend too: the process backend's run covers it")
	}
	r := RabbitMQForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	amqpPort, epmdPort := r.port, r.epmdPort
	for _, tc := range []struct {
		name   string
		port   int
		hangUp bool   // accept and close, as a server does with epmd's request; else never accept
		sign   string // of rabbitPortTakenSigns
	}{
		{"distribution", r.distPort, false, "dist_port_already_used"},
		{"epmd", r.epmdPort, true, "register/listen error: epmd_close"},
		{"amqp", r.port, false, "eaddrinuse"},
	} {
		// The node's epmd outlives it (stopped by Close): gone before
		// another process takes its port.
		_ = r.Kill()
		stopEpmd(r.epmdPort)
		l := holdPort(t, tc.port, tc.hangUp)
		err := r.Start(ctx)
		log := ""
		r.mu.Lock()
		if r.proc != nil {
			log = r.proc.Log()
		}
		r.mu.Unlock()
		if err == nil || !strings.Contains(log, tc.sign) || !r.portTaken() {
			t.Fatalf("%s port %d taken: start: %v; want a failure saying %q; log tail:\n%s", tc.name, tc.port, err, tc.sign, tail(log, 4096))
		}
		if tc.name != "amqp" {
			l.Close()
		}
	}
	// The AMQP port still held; the failed node's epmd runs.
	if err := r.startOnFreePorts(ctx); err != nil {
		t.Fatal(err)
	}
	if r.port == amqpPort {
		t.Fatalf("restarted on the taken AMQP port %d", r.port)
	}
	ch := r.Channel(t)
	if _, err := ch.QueueDeclare("port-taken", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if r.epmdPort != epmdPort && exec.CommandContext(ctx, "epmd", "-port", strconv.Itoa(epmdPort), "-names").Run() == nil {
		t.Fatalf("the failed node's epmd still runs on port %d", epmdPort)
	}
}

// holdPort listens on 127.0.0.1:port until the test ends; hangUp closes
// each connection it accepts once the client wrote, as a server that does
// not speak the client's protocol does.
func holdPort(t *testing.T, port int, hangUp bool) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if hangUp {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					_, _ = c.Read(make([]byte, 64))
					c.Close()
				}()
			}
		}()
	}
	return l
}
