package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// fakeNoTLSServer is a PostgreSQL server on 127.0.0.1 as far as the first
// packets go: it refuses TLS ('N'), then refuses the password, the way a
// server without ssl = on and a wrong password answers.
func fakeNoTLSServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // ends when the listener closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				be := pgproto3.NewBackend(c, c)
				for {
					m, err := be.ReceiveStartupMessage()
					if err != nil {
						return
					}
					switch m.(type) {
					case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
						c.Write([]byte{'N'})
					case *pgproto3.StartupMessage:
						be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "28P01",
							Message: `password authentication failed for user "app"`})
						be.Flush()
						return
					}
				}
			}(c)
		}
	}()
	return ln.Addr().String()
}

// Issue 26 item 8: the server's answer leads, pgx's TLS fallback attempt
// (sslmode=prefer) follows it.
func TestConnectionErrorRootCauseFirst(t *testing.T) {
	addr := fakeNoTLSServer(t)
	host, port, _ := net.SplitHostPort(addr)
	var stdout, stderr bytes.Buffer
	code := dispatch(context.Background(), []string{"status", "--postgres", "postgres://app:pw@" + host + ":" + port + "/app?sslmode=prefer&connect_timeout=5"},
		&stdout, &stderr, func(string) string { return "" })
	got := stderr.String()
	if code != 1 {
		t.Fatalf("exit %d: %s", code, got)
	}
	auth := strings.Index(got, "password authentication failed")
	tls := strings.Index(got, "server refused TLS connection")
	if auth < 0 || tls < 0 || auth > tls || strings.Count(got, "\n") != 1 {
		t.Fatalf("want the password failure first, then the TLS attempt, on one line:\n%s", got)
	}
	if strings.Contains(got, "pw@") {
		t.Fatalf("password shown: %s", got)
	}
}
