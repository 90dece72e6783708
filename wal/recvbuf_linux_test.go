package wal

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestReplicationSocketRecvBuf: the replication connection's socket asks
// for replicationRecvBuf, so that a fast walsender does not find the
// window shut while the coalescer waits (Linux reports twice what was set,
// capped at net.core.rmem_max).
func TestReplicationSocketRecvBuf(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg, err := pgconn.ParseConfig("postgres://u@" + ln.Addr().String() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	c, err := withRecvBuf(cfg.DialFunc)(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	if err := raw.Control(func(fd uintptr) { got, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	rmemMax := replicationRecvBuf
	if b, err := os.ReadFile("/proc/sys/net/core/rmem_max"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			rmemMax = n
		}
	}
	if want := min(replicationRecvBuf, rmemMax); got < want {
		t.Fatalf("SO_RCVBUF %d, want at least %d (replicationRecvBuf %d, rmem_max %d)", got, want, replicationRecvBuf, rmemMax)
	}
}
