package fault

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ProxyMode is what a Proxy does with the bytes it forwards.
type ProxyMode int

const (
	// ModePass forwards everything at once.
	ModePass ProxyMode = iota
	// ModeDelay forwards every chunk Delay after it was read (both ways, order kept).
	ModeDelay
	// ModeStall stops forwarding in both directions but keeps every
	// connection open; new connections are accepted and stall as well.
	ModeStall
	// ModeCut closed every connection and refuses (RST) new ones until the
	// cut ends; then the proxy passes again.
	ModeCut
	// ModeStallReplies forwards what clients send but holds what servers
	// send back (replies, acks, heartbeats), keeping connections open: a
	// server that takes every message and whose acks never arrive.
	ModeStallReplies
)

func (m ProxyMode) String() string {
	switch m {
	case ModePass:
		return "pass"
	case ModeDelay:
		return "delay"
	case ModeStall:
		return "stall"
	case ModeCut:
		return "cut"
	case ModeStallReplies:
		return "stall-replies"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Proxy is a loopback TCP forwarder for fault injection: clients connect to
// Addr and each connection is forwarded to target. Its mode can be changed
// at any time and applies to existing connections immediately.
type Proxy struct {
	name string
	ln   net.Listener

	mu       sync.Mutex
	target   string
	mode     ProxyMode
	delay    time.Duration
	cutUntil time.Time
	changed  chan struct{} // closed and replaced at every mode change
	// match, if set, limits ModeStallReplies to the connections whose
	// client sent it in its first helloSize bytes (StallRepliesTo).
	match  []byte
	conns  map[*proxyConn]struct{}
	closed bool

	accepted, refused atomic.Int64
	wg                sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{}
	blackholed     atomic.Bool

	mu    sync.Mutex
	hello []byte // the client's first helloSize bytes
}

// helloSize is how much of what a client sends first a connection keeps
// for StallRepliesTo: an AMQP client's properties (its connection name)
// are in its third frame, well within it.
const helloSize = 4 << 10

// heard keeps the start of what the client sent.
func (c *proxyConn) heard(b []byte) {
	c.mu.Lock()
	if n := helloSize - len(c.hello); n > 0 {
		c.hello = append(c.hello, b[:min(n, len(b))]...)
	}
	c.mu.Unlock()
}

func (c *proxyConn) said(match []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Contains(c.hello, match)
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.done)
		abort(c.client)
		abort(c.server)
	})
}

// abort closes with RST so that the peer notices at once.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// NewProxy listens on a free 127.0.0.1 port and forwards to target.
func NewProxy(name, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	p := &Proxy{name: name, ln: ln, target: target, changed: make(chan struct{}), conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the port of Addr.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetTarget changes where new connections are forwarded.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Name is the proxy's label.
func (p *Proxy) Name() string { return p.name }

// Mode reports the current mode (a finished cut reports ModePass).
func (p *Proxy) Mode() ProxyMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.modeLocked(time.Now())
}

func (p *Proxy) modeLocked(now time.Time) ProxyMode {
	if p.mode == ModeCut && !now.Before(p.cutUntil) {
		p.mode = ModePass
	}
	return p.mode
}

// Stats returns how many connections were accepted and refused so far.
func (p *Proxy) Stats() (accepted, refused int64) { return p.accepted.Load(), p.refused.Load() }

func (p *Proxy) setMode(m ProxyMode, delay time.Duration, cutFor time.Duration) {
	p.setModeMatch(m, delay, cutFor, nil)
}

func (p *Proxy) setModeMatch(m ProxyMode, delay time.Duration, cutFor time.Duration, match []byte) {
	p.mu.Lock()
	p.mode, p.delay, p.match = m, delay, match
	var victims []*proxyConn
	if m == ModeCut {
		p.cutUntil = time.Now().Add(cutFor)
		for c := range p.conns {
			victims = append(victims, c)
		}
	}
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	for _, c := range victims {
		c.close()
	}
}

// Pass forwards everything immediately.
func (p *Proxy) Pass() { p.setMode(ModePass, 0, 0) }

// Delay forwards every chunk d after it was read.
func (p *Proxy) Delay(d time.Duration) { p.setMode(ModeDelay, d, 0) }

// Stall stops forwarding but keeps connections open.
func (p *Proxy) Stall() { p.setMode(ModeStall, 0, 0) }

// StallReplies stops forwarding from the server to the client only
// (ModeStallReplies).
func (p *Proxy) StallReplies() { p.setMode(ModeStallReplies, 0, 0) }

// StallRepliesTo is StallReplies for the connections whose client sent
// match at its start (e.g. an AMQP connection name), leaving the others
// passing: one of a client's connections (its publisher's) stalls while
// another (its progress record's) goes on.
func (p *Proxy) StallRepliesTo(match string) {
	p.setModeMatch(ModeStallReplies, 0, 0, []byte(match))
}

// Blackhole silently partitions every existing connection: from now on its
// bytes are dropped in both directions and a close on either side is not
// passed on, as after a lost NAT/conntrack entry or a failover that moved
// the server's address. Both ends keep an open socket and hear nothing.
// New connections pass as usual (mode is unchanged).
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	for c := range p.conns {
		c.blackholed.Store(true)
	}
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// Cut closes every connection (RST) and refuses new ones for d; after d the
// proxy passes again by itself.
func (p *Proxy) Cut(d time.Duration) { p.setMode(ModeCut, 0, d) }

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	var all []*proxyConn
	for c := range p.conns {
		all = append(all, c)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range all {
		c.close()
	}
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		refuse := p.closed || p.modeLocked(time.Now()) == ModeCut
		p.mu.Unlock()
		if refuse {
			p.refused.Add(1)
			abort(c)
			continue
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	server, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		abort(client)
		return
	}
	pc := &proxyConn{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	// A cut (or Close) may have started while dialing.
	if p.closed || p.modeLocked(time.Now()) == ModeCut {
		p.mu.Unlock()
		pc.close()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(pc, client, server, false) }()
	go func() { defer wg.Done(); p.pipe(pc, server, client, true) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst through a small queue so that a delay applies per
// chunk without reordering, and a stall holds bytes without closing. Any
// error on either side closes the whole connection pair. toClient: src is
// the server.
func (p *Proxy) pipe(pc *proxyConn, src, dst net.Conn, toClient bool) {
	q := make(chan chunk, 16)
	go func() {
		defer close(q)
		for {
			if !p.waitUnstalled(pc, toClient) {
				return
			}
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if pc.blackholed.Load() {
				if err != nil {
					return // the other side never learns
				}
				continue
			}
			if n > 0 && !toClient {
				pc.heard(buf[:n])
			}
			if n > 0 {
				select {
				case q <- chunk{buf[:n], time.Now()}:
				case <-pc.done:
					return
				}
			}
			if err != nil {
				pc.close()
				return
			}
		}
	}()
	for c := range q {
		if !p.waitForward(pc, c.at, toClient) {
			break
		}
		if pc.blackholed.Load() {
			continue
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	if pc.blackholed.Load() {
		<-pc.done // held open until the proxy closes
	}
	pc.close()
	for range q { // let the reader finish
	}
}

// stallsLocked reports whether mode m holds the bytes of one direction of
// pc. p.mu held.
func (p *Proxy) stallsLocked(pc *proxyConn, m ProxyMode, toClient bool) bool {
	return m == ModeStall || (m == ModeStallReplies && toClient && (p.match == nil || pc.said(p.match)))
}

// waitUnstalled blocks while the proxy stalls this direction; false if the
// connection closed.
func (p *Proxy) waitUnstalled(pc *proxyConn, toClient bool) bool {
	for {
		p.mu.Lock()
		m, ch := p.modeLocked(time.Now()), p.changed
		stalled := p.stallsLocked(pc, m, toClient)
		p.mu.Unlock()
		if !stalled {
			return true
		}
		select {
		case <-ch:
		case <-pc.done:
			return false
		}
	}
}

// waitForward blocks until a chunk read at 'at' may be written: never
// while this direction is stalled, and not before at+delay in delay mode.
func (p *Proxy) waitForward(pc *proxyConn, at time.Time, toClient bool) bool {
	for {
		p.mu.Lock()
		m, d, ch := p.modeLocked(time.Now()), p.delay, p.changed
		if p.stallsLocked(pc, m, toClient) {
			m = ModeStall
		} else if m == ModeStallReplies {
			m = ModePass
		}
		p.mu.Unlock()
		switch m {
		case ModeStall:
			select {
			case <-ch:
				continue
			case <-pc.done:
				return false
			}
		case ModeDelay:
			wait := time.Until(at.Add(d))
			if wait <= 0 {
				return true
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
				return true
			case <-ch:
				t.Stop()
				continue
			case <-pc.done:
				t.Stop()
				return false
			}
		case ModeCut:
			return false
		default:
			select {
			case <-pc.done:
				return false
			default:
				return true
			}
		}
	}
}
