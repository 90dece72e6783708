package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
)

// FreePort returns a currently unused TCP port on 127.0.0.1. It prefers
// ports below Linux's ephemeral range (32768+): servers here are restarted
// on the same port, and while one is down an outgoing connection could
// otherwise be assigned its port as a local port and block the restart.
func FreePort() (int, error) {
	for range 100 {
		port := 20000 + rand.IntN(12000)
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("picking a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreePorts picks n distinct free ports: each is held open until all are
// picked, so that two calls of FreePort in a row cannot return the same
// port (a bench run once got one port for two listeners of a Kafka node,
// which Kafka refuses).
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // taken meanwhile, or picked before: held below
		}
		defer l.Close()
		ports = append(ports, p)
	}
	return ports, nil
}

// onFreePort sets *port to a free port (FreePort) and runs start, which
// binds it. Another process may take a freshly picked port before the
// server binds it, so a failed start is tried again on a new port, three
// times in all, unless ctx ended or taken (if not nil) says the failure is
// not that.
func onFreePort(ctx context.Context, port *int, start func() error, taken func(error) bool) error {
	for attempt := 1; ; attempt++ {
		p, err := FreePort()
		if err != nil {
			return err
		}
		*port = p
		if err = start(); err == nil {
			return nil
		}
		if attempt == 3 || ctx.Err() != nil || (taken != nil && !taken(err)) {
			return err
		}
	}
}
