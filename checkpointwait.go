package outboxd

import (
	"context"
	"sync"
	"time"

	"github.com/outboxd/outboxd/sink"
)

// pollCheckpoint asks the sink what holds the checkpoint partition's last
// stable offset below its end (sink.CheckpointWatcher) and shows it on
// /status (checkpoint_wait) and, while outboxd waits for it, in /readyz's
// reason: a hanging Kafka transaction holds read_committed readers back for
// good, and the operator should not have to guess it from a stalled reader.
func (mo *monitor) pollCheckpoint(ctx context.Context) {
	if mo.watcher == nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, mo.interval)
	defer cancel()
	w, err := mo.watcher.CheckpointWait(pctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		mo.log.Debug("monitor: checkpoint partition poll failed", "err", err)
		return
	}
	prev := mo.st.setCheckpointWait(w)
	switch {
	case w != nil && (prev == nil || prev.StableOffset != w.StableOffset || prev.Waiting != w.Waiting):
		mo.log.Warn("a transaction holds the checkpoint partition's last stable offset", "wait", w.String())
	case w == nil && prev != nil:
		mo.log.Info("the checkpoint partition's last stable offset moved on", "topic", prev.Topic, "partition", prev.Partition)
	}
}

// watchCheckpointWhile polls the checkpoint partition every interval until
// the returned stop runs: Run's startup reads the checkpoint before the
// monitor runs, and that read is what may wait.
func (mo *monitor) watchCheckpointWhile(ctx context.Context) (stop func()) {
	if mo.watcher == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(mo.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				mo.pollCheckpoint(ctx)
			}
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		// The startup's read is over: what it waited for is not waited
		// for any more (the monitor shows what still holds the partition).
		mo.st.mu.Lock()
		if w := mo.st.checkpointWait; w != nil && w.Waiting {
			mo.st.checkpointWait = nil
		}
		mo.st.mu.Unlock()
	}
}

// setCheckpointWait records what holds the checkpoint partition (nil:
// nothing) and returns the previous value.
func (s *state) setCheckpointWait(w *sink.CheckpointWait) *sink.CheckpointWait {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.checkpointWait
	s.checkpointWait = w
	return prev
}

// checkpointWaitSuffix is /readyz's addition while outboxd waits for the
// checkpoint partition's stable offset; s.mu is held.
func (s *state) checkpointWaitSuffix() string {
	if w := s.checkpointWait; w != nil && w.Waiting {
		return ": " + w.String()
	}
	return ""
}
