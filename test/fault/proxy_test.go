package fault

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// echoServer echoes lines back.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, within time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func TestProxyModes(t *testing.T) {
	p, err := NewProxy("test", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if got, err := roundTrip(c, "pass", time.Second); err != nil || got != "pass" {
		t.Fatalf("pass: %q %v", got, err)
	}

	p.Delay(150 * time.Millisecond)
	start := time.Now()
	if got, err := roundTrip(c, "delay", 2*time.Second); err != nil || got != "delay" {
		t.Fatalf("delay: %q %v", got, err)
	}
	if d := time.Since(start); d < 300*time.Millisecond { // both directions
		t.Fatalf("delay: round trip took %v, want ≥ 300ms", d)
	}

	p.Stall()
	var ne net.Error
	if _, err := roundTrip(c, "stall", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("stall: want a timeout, got %v", err)
	}
	p.Pass()
	// The stalled bytes arrive once the stall ends, on the same connection.
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "stall\n" {
		t.Fatalf("after stall: %q %v", line, err)
	}

	p.Cut(500 * time.Millisecond)
	if _, err := roundTrip(c, "cut", time.Second); err == nil {
		t.Fatal("cut: connection still works")
	}
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		if _, err := roundTrip(c2, "refused", 300*time.Millisecond); err == nil {
			t.Fatal("cut: new connection works during the cut")
		}
		c2.Close()
	}
	time.Sleep(600 * time.Millisecond)
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, "again", time.Second); err != nil || got != "again" {
		t.Fatalf("after cut: %q %v", got, err)
	}
	if acc, ref := p.Stats(); acc != 2 || ref < 1 {
		t.Fatalf("stats: %d accepted, %d refused", acc, ref)
	}
}

func TestProxyBlackhole(t *testing.T) {
	p, err := NewProxy("test", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "before", time.Second); err != nil || got != "before" {
		t.Fatalf("before: %q %v", got, err)
	}
	p.Blackhole()
	var ne net.Error
	if _, err := roundTrip(c, "lost", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("blackholed connection: want a timeout, got %v", err)
	}
	// New connections pass.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2, "new", time.Second); err != nil || got != "new" {
		t.Fatalf("new connection: %q %v", got, err)
	}
	// The old one still hears nothing, not even a close.
	if _, err := roundTrip(c, "still", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("blackholed connection later: want a timeout, got %v", err)
	}
}

// StallReplies: what the client sends reaches the server, what the server
// sends back waits until the proxy passes again, on the same connection.
func TestProxyStallReplies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() { // reports the first line, then echoes it
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		got <- line
		_, _ = c.Write([]byte(line))
		_, _ = io.Copy(io.Discard, c)
	}()
	p, err := NewProxy("test", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.StallReplies()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ne net.Error
	if _, err := roundTrip(c, "ping", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("stall-replies: want a timeout, got %v", err)
	}
	select {
	case line := <-got:
		if line != "ping\n" {
			t.Fatalf("server read %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client's bytes did not reach the server")
	}
	if p.Mode() != ModeStallReplies || p.Mode().String() != "stall-replies" {
		t.Fatalf("mode %v", p.Mode())
	}
	p.Pass()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("after stall-replies: %q %v", line, err)
	}
}

// StallRepliesTo stalls the replies of the connections whose client named
// itself first, and only those: the other connection keeps its round trips.
func TestProxyStallRepliesTo(t *testing.T) {
	p, err := NewProxy("test", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dial := func(hello string) net.Conn {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if got, err := roundTrip(c, hello, 5*time.Second); err != nil || got != hello {
			t.Fatalf("hello %q: %q %v", hello, got, err)
		}
		return c
	}
	pub, prog := dial("I am the publisher"), dial("I am the progress")
	p.StallRepliesTo("publisher")
	var ne net.Error
	if _, err := roundTrip(pub, "ping", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the named connection: want a timeout, got %v", err)
	}
	for range 3 {
		if got, err := roundTrip(prog, "ping", 5*time.Second); err != nil || got != "ping" {
			t.Fatalf("the other connection: %q %v, want its echo", got, err)
		}
	}
	p.Pass()
	_ = pub.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(pub).ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("after the stall: %q %v", line, err)
	}
}
