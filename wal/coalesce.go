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
// meanwhile in one go.
//
// The wait applies only while the stream is busy: a read that blocked
// (the stream had gone quiet: a lone event, or the first of a burst) or
// returned a large chunk is never followed by one, so an event after a quiet
// spell is read the moment it arrives, and the longest delay the wait adds
// to any event is coalesceWait, far below the confirm tick and the status
// interval. It runs in the one goroutine that reads the connection, and only
// once streaming has started (on): the SQL the connection runs before that
// is read without waiting.
type coalescer struct {
	src  io.Reader
	on   bool // streaming (Start); the connection's SQL phase reads plainly
	wait bool // the last read was small and did not block: wait before the next
}

const (
	// coalesceSmallRead: a read shorter than this leaves room for more.
	coalesceSmallRead = 16 << 10
	// coalesceWait is the wait before a read that follows a small one.
	coalesceWait = 200 * time.Microsecond
	// coalesceIdleBlock: a read that blocked this long found the stream
	// idle, and is not followed by a wait.
	coalesceIdleBlock = time.Millisecond
)

func (c *coalescer) Read(p []byte) (int, error) {
	if c.wait {
		time.Sleep(coalesceWait)
	}
	start := time.Now()
	n, err := c.src.Read(p)
	c.wait = c.on && err == nil && n < coalesceSmallRead && n < len(p) && time.Since(start) < coalesceIdleBlock
	return n, err
}
