package wal

import (
	"fmt"
	"io"
	"testing"
	"testing/synctest"
	"time"
)

// timedReader hands out reads of the given sizes, each after its delay (how
// long the read blocks waiting for the server), and records when each read
// began.
type timedReader struct {
	sizes  []int
	delays []time.Duration
	began  []time.Time
}

func (r *timedReader) Read(p []byte) (int, error) {
	i := len(r.began)
	if i == len(r.sizes) {
		return 0, io.EOF
	}
	r.began = append(r.began, time.Now())
	time.Sleep(r.delays[i])
	return min(r.sizes[i], len(p)), nil
}

// gaps is the time between the end of each read and the start of the next:
// what the coalescer waited.
func (r *timedReader) gaps(start time.Time) []time.Duration {
	var out []time.Duration
	end := start
	for i, b := range r.began {
		if i > 0 {
			out = append(out, b.Sub(end))
		}
		end = b.Add(r.delays[i])
	}
	return out
}

// readAll reads r through a streaming coalescer, once per scripted read.
func readAll(t *testing.T, r *timedReader) {
	t.Helper()
	c := &coalescer{src: r, on: true}
	buf := make([]byte, 2*coalesceSmallRead)
	for range r.sizes {
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCoalescerWaitsOnlyWhileTheStreamIsBusy: a small read that came back
// at once (the server is sending faster than one read each) is followed by
// a short wait, so the next read carries more; a read that blocked (the
// stream was idle: a lone event) or a large one is not, so an event after
// a quiet spell is read as soon as it arrives.
func TestCoalescerWaitsOnlyWhileTheStreamIsBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &timedReader{
			sizes: []int{100, 100, 100, coalesceSmallRead, 100, 100, 100},
			delays: []time.Duration{
				10 * time.Second, // idle: a lone event after a quiet spell
				0,                // busy from here: each returns at once
				0,
				0,                      // a large read
				0,                      // small, at once
				coalesceIdleBlock,      // blocked as long as an idle stream does
				coalesceIdleBlock / 10, // short block: busy
			},
		}
		start := time.Now()
		readAll(t, r)
		want := []time.Duration{0, coalesceWait, coalesceWait, 0, coalesceWait, 0}
		got := r.gaps(start)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("waits before reads 2..%d: %v, want %v", len(r.sizes), got, want)
			}
		}
	})
}

// TestCoalescerLengthensItsWaitWhileTheStreamIsFast: while each read
// after a wait still brings at least coalesceBusyRead (the server sends
// tens of thousands of events a second), the next wait doubles, up to
// coalesceMaxWait, so that a draining backlog is read in a few large reads
// rather than many small ones; a read that brings less (a trickle) takes
// the wait back to coalesceWait, and an idle stream ends waiting.
func TestCoalescerLengthensItsWaitWhileTheStreamIsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := coalesceBusyRead
		r := &timedReader{
			sizes:  []int{100, big, big, big, big, big, 100, 100, big, big, coalesceSmallRead, big},
			delays: []time.Duration{0, 0, 0, 0, 0, 0, 0, 0, coalesceIdleBlock, 0, 0, 0},
		}
		start := time.Now()
		readAll(t, r)
		w := coalesceWait
		want := []time.Duration{
			w,               // after a small read at once
			2 * w,           // the read after the wait brought a busy stream's worth: double
			4 * w,           // and again
			coalesceMaxWait, // capped
			coalesceMaxWait, // and kept while the stream stays fast
			coalesceMaxWait,
			w, // a trickle's read after the longest wait: back to the shortest
			w, // and no longer while it trickles
			0, // a read that blocked: the stream was idle, no wait
			w, // busy again: from the shortest wait
			0, // a large read: none
		}
		if 8*w < coalesceMaxWait {
			t.Fatalf("the test assumes coalesceMaxWait (%s) ≤ 8 × coalesceWait (%s)", coalesceMaxWait, w)
		}
		got := r.gaps(start)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("waits before reads 2..%d: %v, want %v", len(r.sizes), got, want)
			}
		}
	})
}

// TestCoalescerNeverDelaysALoneEvent: the wait is far below the confirm
// tick, so the event a wait holds back is read long before a status update
// is due.
func TestCoalescerNeverDelaysALoneEvent(t *testing.T) {
	if coalesceWait > coalesceMaxWait || coalesceMaxWait > time.Millisecond || coalesceIdleBlock < coalesceMaxWait {
		t.Fatalf("wait %s to %s, idle block %s: the wait must stay within a millisecond and not above the idle threshold", coalesceWait, coalesceMaxWait, coalesceIdleBlock)
	}
}

// TestCoalescerTellsDraining: Draining hears true once the stream stays
// fast (the wait reached coalesceMaxWait) or a read fills
// coalesceSmallRead (the reader is behind), and false at a read that
// waited for the server as long as an idle stream does with no fast read
// in the last coalesceQuietAfter (a drain's brief stall is no end of it);
// each once per turn. A trickle (the latency cases' rates) never turns it
// on.
func TestCoalescerTellsDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := coalesceBusyRead
		var heard []bool
		var at []int // the read after which each was heard
		r := &timedReader{
			sizes: []int{100, 100, 100, 100, // a trickle: small reads at once, never fast
				100, big, big, big, big, big, // fast: the wait doubles to the longest
				100,                                       // a trickle's read after it: still draining
				100,                                       // a short stall just after fast reads: still draining
				100,                                       // idle
				coalesceSmallRead, coalesceSmallRead, 100, // behind at once
				100}, // idle
			delays: []time.Duration{0, 0, 0, 0,
				0, 0, 0, 0, 0, 0,
				0,
				coalesceIdleBlock,
				10 * time.Second,
				0, 0, 0,
				10 * time.Second},
		}
		c := &coalescer{src: r, on: true, onDrain: func(d bool) { heard, at = append(heard, d), append(at, len(r.began)) }}
		buf := make([]byte, 2*coalesceSmallRead)
		for range r.sizes {
			if _, err := c.Read(buf); err != nil {
				t.Fatal(err)
			}
		}
		// Reads 5-10: after read 8 (waits 2w, 4w, then the longest) the
		// wait is coalesceMaxWait: draining.
		want, wantAt := []bool{true, false, true, false}, []int{8, 13, 14, 17}
		if fmt.Sprint(heard, at) != fmt.Sprint(want, wantAt) {
			t.Fatalf("Draining heard %v after reads %v, want %v after %v", heard, at, want, wantAt)
		}
		if coalesceQuietAfter <= coalesceIdleBlock+coalesceMaxWait+coalesceWait {
			t.Fatalf("coalesceQuietAfter (%s) must outlast a stall (%s) after the longest wait", coalesceQuietAfter, coalesceIdleBlock)
		}
	})
}

// TestCoalescerGoesQuietUnderASteadyTrickle: after a moment's backlog
// (one large read) a steady stream of a few thousand events a second
// follows, each read small and none blocking a whole coalesceIdleBlock.
// The stream is quiet again coalesceQuietAfter after the last fast read,
// not draining for as long as the trickle lasts (the bench's latency case
// at 5,000 ev/s stayed under SCHED_BATCH for its whole run that way).
func TestCoalescerGoesQuietUnderASteadyTrickle(t *testing.T) {
	for _, block := range []time.Duration{0, coalesceIdleBlock - coalesceWait - time.Microsecond} {
		t.Run(fmt.Sprint("each read blocks ", block), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sizes, delays := []int{coalesceSmallRead}, []time.Duration{0}
				for range 200 {
					sizes, delays = append(sizes, 100), append(delays, block)
				}
				r := &timedReader{sizes: sizes, delays: delays}
				var heard []bool
				var at []time.Duration // since the large read ended
				start := time.Now()
				c := &coalescer{src: r, on: true, onDrain: func(d bool) { heard, at = append(heard, d), append(at, time.Since(start)) }}
				buf := make([]byte, 2*coalesceSmallRead)
				for range r.sizes {
					if _, err := c.Read(buf); err != nil {
						t.Fatal(err)
					}
				}
				if fmt.Sprint(heard) != "[true false]" {
					t.Fatalf("Draining heard %v, want [true false]", heard)
				}
				// Quiet at the first read that ends coalesceQuietAfter or more
				// after the large one: within one read's wait and block of it.
				if at[0] != 0 || at[1] < coalesceQuietAfter || at[1] > coalesceQuietAfter+coalesceWait+block {
					t.Fatalf("Draining heard at %v, want 0 and [%s, %s]", at, coalesceQuietAfter, coalesceQuietAfter+coalesceWait+block)
				}
			})
		})
	}
}
