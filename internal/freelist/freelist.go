// Package freelist keeps spare objects of the hot path for reuse: what the
// relay allocates per event in one goroutine and frees in a broker
// client's callback in another.
//
// It is sync.Pool without what makes sync.Pool unfit here: the race
// detector drops a quarter of its Puts at random, so the allocations of a
// path that uses it cannot be pinned by a test (make check runs -race),
// and a garbage collection empties it, so a drain's steady state depends
// on the GC's pace. A List is a stack under a mutex, bounded, so that a
// burst leaves at most Max spares behind.
package freelist

import "sync"

// List is a bounded stack of spare *T, safe for concurrent use. Its zero
// value keeps up to DefaultMax spares.
type List[T any] struct {
	mu    sync.Mutex
	spare []*T
	Max   int // spares kept (0: DefaultMax); a Put beyond it is left to the GC
	// Empty, when set, empties a spare instead of zeroing it: for a T
	// holding memory meant to be reused with it (the relay's events keep
	// the buffers their records were built into). It must drop every
	// other pointer of t, or a spare keeps alive what it pointed to.
	Empty func(t *T)
}

// DefaultMax is a List's bound when Max is 0: a Kafka produce response
// acks a batch of up to about this many small records at once, and each
// comes back here before the reader needs it again.
const DefaultMax = 4096

// Get returns a spare, or a new zero T when there is none.
func (l *List[T]) Get() *T {
	l.mu.Lock()
	if n := len(l.spare); n > 0 {
		t := l.spare[n-1]
		l.spare[n-1] = nil
		l.spare = l.spare[:n-1]
		l.mu.Unlock()
		return t
	}
	l.mu.Unlock()
	return new(T)
}

// Put zeroes t (so that a spare holds on to nothing it pointed to), or
// empties it with Empty, and keeps it for the next Get. The caller must not
// use t afterwards.
func (l *List[T]) Put(t *T) {
	if l.Empty != nil {
		l.Empty(t)
	} else {
		var zero T
		*t = zero
	}
	l.mu.Lock()
	max := l.Max
	if max == 0 {
		max = DefaultMax
	}
	if len(l.spare) < max {
		l.spare = append(l.spare, t)
	}
	l.mu.Unlock()
}

// Len is the number of spares held.
func (l *List[T]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.spare)
}
