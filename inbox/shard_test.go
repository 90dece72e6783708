package inbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
)

// KeyWorkers: a lane's keys are applied concurrently, each key's events in
// the lane's order, each once; with offsets the marks only move forward and
// never pass an event not done, ending at the last one.
func TestShardedLaneKeepsKeyOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const keys, per = 7, 50 // 7: no key lines up with a worker by offset
		db := &memDB{inbox: map[string]bool{}}
		var running, most atomic.Int32
		s := &settings{name: "t", batch: 3, maxAttempts: 3, minBackoff: time.Millisecond, maxBackoff: time.Second,
			handler: func(_ context.Context, _ pgx.Tx, ev *Event) error {
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(time.Duration(1+ev.Offset%3) * time.Millisecond) // database round trips
				running.Add(-1)
				return nil
			}}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		workers := make([]*partition, 4)
		for i := range workers {
			workers[i] = newPartition("orders", 0, s, db, nil, nil, log)
		}
		var mu sync.Mutex
		var marks []int64
		l := newShardedLane(workers, func(ev *Event) { mu.Lock(); marks = append(marks, ev.Offset); mu.Unlock() }, laneOpts{offsets: true}, 1<<20)
		for _, w := range workers {
			go w.run(t.Context())
		}
		var evs []*Event
		for i := range keys * per {
			evs = append(evs, &Event{ID: fmt.Sprintf("k%d/%03d", i%keys, i/keys), Key: fmt.Appendf(nil, "k%d", i%keys), Offset: int64(i)})
		}
		l.push(evs[:100], 0)
		l.push(evs, 0) // a repeated fetch: nothing twice
		for db.applied() < keys*per {
			time.Sleep(time.Millisecond)
		}
		synctest.Wait()
		l.stop()
		if len(db.effects) != keys*per || db.dups != 0 {
			t.Fatalf("%d effects, %d duplicates; want %d, 0", len(db.effects), db.dups, keys*per)
		}
		last := map[string]string{}
		for _, id := range db.effects {
			k, _, _ := strings.Cut(id, "/")
			if id <= last[k] {
				t.Fatalf("%s applied after %s", id, last[k])
			}
			last[k] = id
		}
		if !slices.IsSorted(marks) || marks[len(marks)-1] != keys*per-1 {
			t.Fatalf("marks %v: not increasing or not ending at %d", marks, keys*per-1)
		}
		if most.Load() < 2 {
			t.Fatalf("at most %d handlers at once: the keys were not applied concurrently", most.Load())
		}
	})
}
