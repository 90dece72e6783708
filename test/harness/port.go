package harness

import (
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
