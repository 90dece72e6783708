package freelist

import (
	"sync"
	"testing"
)

type obj struct {
	n int
	p *int
}

// A spare comes back zeroed, most recent first; beyond Max, Put keeps
// nothing; an empty list makes a new one.
func TestList(t *testing.T) {
	l := List[obj]{Max: 2}
	x := 7
	a, b, c := &obj{n: 1, p: &x}, &obj{n: 2}, &obj{n: 3}
	l.Put(a)
	l.Put(b)
	l.Put(c)
	if l.Len() != 2 {
		t.Fatalf("%d spares, want 2 (Max)", l.Len())
	}
	if got := l.Get(); got != b || *got != (obj{}) {
		t.Fatalf("Get = %p %+v, want the last Put (%p), zeroed", got, *got, b)
	}
	if got := l.Get(); got != a || got.p != nil {
		t.Fatalf("Get = %p %+v, want %p zeroed", got, *got, a)
	}
	if got := l.Get(); got == nil || got == a || got == b || got == c {
		t.Fatalf("Get on an empty list = %p, want a new object", got)
	}
	// Steady state: a Get after a Put allocates nothing.
	l.Put(a)
	if n := testing.AllocsPerRun(100, func() { l.Put(l.Get()) }); n != 0 {
		t.Errorf("Get+Put: %.0f allocations, want 0", n)
	}
}

// Gets and Puts from many goroutines hand each object to one holder at a
// time (-race).
func TestListConcurrent(t *testing.T) {
	var l List[obj]
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				o := l.Get()
				if o.n != 0 {
					t.Errorf("goroutine %d got an object in use (n=%d)", g, o.n)
					return
				}
				o.n = i + 1
				l.Put(o)
			}
		})
	}
	wg.Wait()
}
