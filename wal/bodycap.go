package wal

import (
	"bufio"
	"encoding/binary"
)

// bodyCap sits between the connection's buffered reader and pgproto3, which
// reads every backend message whole into memory. It passes messages through
// unchanged, except that a CopyData message whose body is longer than max
// (a 400 MiB row or logical message) is cut to its first keep bytes: the
// rest is read off the socket and dropped as it arrives, so such a message
// never sits in memory. The cut is recorded so that the stream can tell the
// caller (Row.Oversize, Message.Oversize), which treats the event as invalid.
//
// It runs under pgproto3's reader, in the one goroutine that reads the
// connection.
type bodyCap struct {
	src  *bufio.Reader
	co   *coalescer // under src (nil in tests that build a bodyCap alone)
	max  int        // 0: no cap (until Start sets one)
	keep int

	out  [5]byte // a message header not yet handed on
	outN int     // bytes of out still to hand on (from the end)
	pass int     // body bytes of the current message still to pass on
	drop int     // body bytes to discard after them

	seq  uint64 // CopyData messages seen
	cuts []cutMsg
}

// cutMsg is a CopyData message bodyCap cut: the seq-th, of size body bytes.
type cutMsg struct {
	seq  uint64
	size int
}

// capKey finds a connection's bodyCap in pgconn's CustomData.
const capKey = "outboxd.wal.bodycap"

func (c *bodyCap) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		switch {
		case c.outN > 0:
			k := copy(p[n:], c.out[5-c.outN:])
			c.outN -= k
			n += k
		case c.pass > 0:
			if n > 0 && c.src.Buffered() == 0 {
				return n, nil // hand on what we have rather than block
			}
			m, err := c.src.Read(p[n:min(len(p), n+c.pass)])
			n += m
			c.pass -= m
			if err != nil {
				return n, err
			}
		case c.drop > 0:
			if n > 0 {
				return n, nil
			}
			d, err := c.src.Discard(c.drop)
			c.drop -= d
			if err != nil {
				return n, err
			}
		default:
			if n > 0 && c.src.Buffered() < 5 {
				return n, nil
			}
			hdr, err := c.src.Peek(5)
			if err != nil {
				return n, err
			}
			copy(c.out[:], hdr)
			_, _ = c.src.Discard(5)
			c.outN = 5
			body := int(int32(binary.BigEndian.Uint32(c.out[1:]))) - 4
			if body < 0 {
				body = 0 // pgproto3 reports the invalid length
			}
			c.pass = body
			if c.out[0] != 'd' {
				continue
			}
			c.seq++
			if c.max > 0 && body > c.max {
				c.pass, c.drop = c.keep, body-c.keep
				binary.BigEndian.PutUint32(c.out[1:], uint32(c.keep+4))
				c.cuts = append(c.cuts, cutMsg{seq: c.seq, size: body})
			}
		}
	}
	return n, nil
}

// cutSize reports whether the seq-th CopyData message was cut, and its size.
func (c *bodyCap) cutSize(seq uint64) int {
	for len(c.cuts) > 0 && c.cuts[0].seq < seq {
		c.cuts = c.cuts[1:]
	}
	if len(c.cuts) > 0 && c.cuts[0].seq == seq {
		size := c.cuts[0].size
		c.cuts = c.cuts[1:]
		return size
	}
	return 0
}

// setMax sets the cap; keep is what is kept of a longer body: enough for the
// headers and the first columns (the event id, for the error).
func (c *bodyCap) setMax(max int) {
	c.max = max
	c.keep = min(max, 64<<10)
}
