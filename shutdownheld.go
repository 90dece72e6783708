package outboxd

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/slot"
)

// heldShutdownQuiet is how long a shutdown waits without a single ack,
// while topics are held, before it stops waiting for the in-flight events.
// The events of a held topic are never sent until someone creates the topic,
// so waiting the whole --shutdown-timeout for them only delays the exit;
// leaving earlier loses nothing (nothing past them is confirmed, and the
// slot re-sends them on restart), and the acks of the events of other
// topics keep the wait going as long as they arrive.
const heldShutdownQuiet = time.Second

// waitDrainedOrHeld waits until no event of wm is in flight, or ctx ends,
// or held reports held topics and no ack has come for quiet.
func waitDrainedOrHeld(ctx context.Context, wm *slot.Watermark, held func() bool, quiet time.Duration) bool {
	t := time.NewTimer(quiet)
	defer t.Stop()
	for {
		drained, changed := wm.Drained()
		if drained {
			return true
		}
		select {
		case <-changed:
			t.Reset(quiet)
		case <-t.C:
			if held() {
				return false
			}
			t.Reset(quiet)
		case <-ctx.Done():
			return false
		}
	}
}

// endOnShutdown ends the committer when the session stops on shutdown. In
// exactly-once mode a shutdown between transactions commits the open Kafka
// transaction, but a commit waits for every record in it, and a held
// topic's records are never sent until someone creates the topic: with a
// topic held, that commit could only time out (eosCommitTimeout) and hold
// up the exit. It aborts instead. That loses nothing: the checkpoint and the
// slot stay at the last committed transaction, and the next run sends the
// aborted transaction's events again, once, for read_committed consumers.
// (A held topic's records are in the open transaction: an aborted one fails
// them, so only the open one can hold them.)
func (s *streamer) endOnShutdown(ctx context.Context) error {
	betweenTxns := s.txn == nil
	if betweenTxns && s.commit.pending() && s.state.hasTopicHolds() {
		s.log.Info("shutdown: topics are held, so the open Kafka transaction cannot commit; aborting it: its events will be re-sent from the last checkpoint on restart")
		betweenTxns = false
	}
	return s.commit.end(ctx, true, betweenTxns)
}
