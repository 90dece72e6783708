package wal

import (
	"io"
	"time"
)

// coalescer sits under the replication connection's buffered reader and
// makes the reads of a busy stream carry more. While a backlog drains, the
// walsender sends message after message; read as soon as each arrives, the
// stream costs outboxd (and the walsender, woken to refill the socket) a
// wake-up and a context switch every few events. So a small read that came
// back at once, which means the server is still sending, is followed by a
// short wait before the next read, and that read takes what arrived
// meanwhile in one go. While the reads after a wait keep bringing a fast
// stream's worth (a backlog draining: tens of thousands of events a
// second), the wait doubles, up to coalesceMaxWait: every wake-up of the
// process costs it (and the Go runtime's monitor thread, which polls every
// 20 µs for a while after each one) several microseconds of kernel time,
// so a drain read in fewer, larger chunks costs less per event; and the
// wait itself keeps the goroutine's P (holdSleep), so that it does not wake
// that monitor thread.
//
// The wait applies only while the stream is busy: a read that blocked
// (the stream had gone quiet: a lone event, or the first of a burst) or
// returned a large chunk is never followed by one, so an event after a quiet
// spell is read the moment it arrives. A stream slower than
// coalesceBusyRead per coalesceWait (the latency cases' thousands of events
// a second) is held back at most coalesceWait, a fast one at most
// coalesceMaxWait: far below the confirm tick and the status interval. It runs in the one goroutine that reads the connection, and only
// once streaming has started (on): the SQL the connection runs before that
// is read without waiting.
//
// It also tells StartOptions.Draining when the stream turns busy, a backlog
// draining (the wait reached coalesceMaxWait, or a read filled
// coalesceSmallRead: the reader is behind), and when it goes quiet again: a
// read neither large nor fast with no fast read in the last
// coalesceQuietAfter (a drain's reads block or come back small now and
// then, when the walsender falls behind for a moment: that is no end of
// it), or the session ended.
type coalescer struct {
	src      io.Reader
	on       bool          // streaming (Start); the connection's SQL phase reads plainly
	wait     time.Duration // before the next read: the last one was small and did not block
	draining bool          // told to onDrain last (false until a drain begins)
	onDrain  func(bool)    // StartOptions.Draining; nil: none
	lastFast time.Time     // when a read last brought a fast stream's worth
	// sleep is the wait: holdSleep on a live connection; nil, time.Sleep
	// (the tests, whose synctest bubbles fake the clock).
	sleep func(time.Duration)
}

// newCoalescer is the live connection's coalescer, which waits in
// holdSleep.
func newCoalescer(src io.Reader) *coalescer { return &coalescer{src: src, sleep: holdSleep} }

const (
	// coalesceSmallRead: a read shorter than this leaves room for more.
	coalesceSmallRead = 64 << 10
	// coalesceWait is the wait before a read that follows a small one.
	coalesceWait = 200 * time.Microsecond
	// coalesceMaxWait is the longest wait: reached only while the stream
	// stays fast (coalesceBusyRead).
	coalesceMaxWait = time.Millisecond
	// coalesceBusyRead: a read after a wait that brought at least this
	// much (4 KiB in 200 µs is 20 MB/s, tens of thousands of events a
	// second: a backlog draining) doubles the next wait.
	coalesceBusyRead = 4 << 10
	// coalesceIdleBlock: a read that blocked this long found the stream
	// idle, and is not followed by a wait.
	coalesceIdleBlock = time.Millisecond
	// coalesceQuietAfter: a draining stream is quiet again at a read
	// neither large nor fast when no read this recent brought a fast
	// stream's worth.
	coalesceQuietAfter = 10 * time.Millisecond
)

func (c *coalescer) Read(p []byte) (int, error) {
	waited := c.wait
	if waited > 0 {
		if c.sleep != nil {
			c.sleep(waited)
		} else {
			time.Sleep(waited)
		}
	}
	start := time.Now()
	n, err := c.src.Read(p)
	now := time.Now()
	switch {
	case !c.on || err != nil:
		c.wait = 0 // not streaming (yet, or any more): read plainly
		c.drain(false)
		return n, err
	case now.Sub(start) >= coalesceIdleBlock:
		c.wait = 0 // idle: read the next event the moment it arrives
	case n >= coalesceSmallRead || n == len(p):
		c.wait = 0 // a large read: the buffer has plenty to decode first
		c.lastFast = now
		c.drain(true)
		return n, err
	case waited > 0 && n >= coalesceBusyRead:
		c.wait = min(2*waited, coalesceMaxWait) // fast: lengthen the wait
		c.lastFast = now
		if c.wait == coalesceMaxWait {
			c.drain(true)
		}
		return n, err
	default:
		c.wait = coalesceWait // small, at once: a short wait
	}
	// Idle, or small: quiet once no read has been fast for a while,
	// whether this one blocked or not. A steady stream of a few thousand
	// events a second never blocks a whole coalesceIdleBlock, and after a
	// moment's backlog it must not stay draining for good.
	if now.Sub(c.lastFast) >= coalesceQuietAfter {
		c.drain(false)
	}
	return n, err
}

// drain tells onDrain that the stream turned busy or quiet, once per turn.
func (c *coalescer) drain(busy bool) {
	if busy == c.draining || c.onDrain == nil {
		return
	}
	c.draining = busy
	c.onDrain(busy)
}
