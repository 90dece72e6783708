package inbox

import (
	"hash/fnv"
	"sync"
)

// lane is what a source pushes events into and the Consumer stops: one
// partition (its own goroutine), or, with KeyWorkers above 1, a sharded
// lane of several.
type lane interface {
	push(evs []*Event, hwm int64)
	stop()
}

// shardedLane applies one lane's events with several partitions at once,
// each event going to the one its key hashes to: one key's events stay on
// one sequential worker, in the lane's order, while different keys are
// applied concurrently (each worker has its own transactions). The broker
// is acknowledged as with one worker: with offsets (Kafka), at the end of
// the lane's prefix of done events, so a crash replays from the oldest
// event not done whichever worker has it; else each event once done.
type shardedLane struct {
	workers       []*partition
	ack           func(*Event)
	offsets       bool
	pause, resume func()
	highWater     int

	mu       sync.Mutex
	next     int64       // offset after the last event pushed (offsets)
	inOrder  doneInOrder // pushed and not done, in order (offsets)
	inflight int         // pushed and not done
	paused   bool
}

func newShardedLane(workers []*partition, ack func(*Event), o laneOpts, highWater int) *shardedLane {
	l := &shardedLane{workers: workers, ack: ack, offsets: o.offsets, pause: o.pause, resume: o.resume,
		highWater: highWater, next: -1}
	for _, w := range workers {
		w.mark = l.done
	}
	return l
}

// shard is the worker of ev: by key; an event without a key has no order to
// keep, and goes by offset.
func (l *shardedLane) shard(ev *Event) int {
	if len(ev.Key) == 0 {
		return int(uint64(ev.Offset) % uint64(len(l.workers)))
	}
	h := fnv.New32a()
	_, _ = h.Write(ev.Key)
	return int(h.Sum32() % uint32(len(l.workers)))
}

func (l *shardedLane) push(evs []*Event, hwm int64) {
	groups := make([][]*Event, len(l.workers))
	l.mu.Lock()
	for _, ev := range evs {
		if l.offsets {
			if ev.Offset < l.next {
				continue // already pushed: a fetch repeated after a pause
			}
			l.next = ev.Offset + 1
			l.inOrder.take(ev)
		}
		l.inflight++
		i := l.shard(ev)
		groups[i] = append(groups[i], ev)
	}
	if l.inflight >= l.highWater && !l.paused && l.pause != nil {
		l.pause()
		l.paused = true
	}
	l.mu.Unlock()
	for i, g := range groups {
		if len(g) > 0 {
			l.workers[i].push(g, hwm)
		}
	}
}

// done is every worker's mark: ev is applied, a duplicate or parked.
func (l *shardedLane) done(ev *Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	if l.paused && l.resume != nil && l.inflight <= l.highWater/2 {
		l.resume()
		l.paused = false
	}
	if !l.offsets {
		l.ack(ev)
		return
	}
	if last := l.inOrder.done(ev); last != nil {
		l.ack(last) // under mu: marks only move forward
	}
}

func (l *shardedLane) stop() {
	var wg sync.WaitGroup
	for _, w := range l.workers {
		wg.Go(w.stop)
	}
	wg.Wait()
	l.mu.Lock()
	if l.paused && l.resume != nil {
		l.resume()
		l.paused = false
	}
	l.mu.Unlock()
}
