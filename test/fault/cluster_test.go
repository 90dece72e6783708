package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/sysid"
	"github.com/outboxd/outboxd/sink/kafka"
	"github.com/outboxd/outboxd/test/harness"
)

// markerGrace bounds how long Apache Kafka may take to make a committed
// transaction visible to read_committed readers (see monitor.visibilityGrace):
// the commit markers may wait for a new partition leader after a kill.
const markerGrace = 10 * time.Second

// clusterFault injects one of the Apache-cluster faults. Each returns when
// the cluster is whole again (every node up); settling is the caller's.
func (w *world) clusterFault(kind faultKind) (string, error) {
	c := w.cluster
	if c == nil {
		return "", errNotCluster
	}
	ctx, cancel := context.WithTimeout(w.ctx, 4*time.Minute)
	defer cancel()
	switch kind {
	case faultLeaderKill:
		topic := w.topics[w.rng.IntN(len(w.topics))]
		part := int32(w.rng.IntN(partitions))
		nd, err := c.Leader(ctx, topic, part)
		if err != nil {
			return "", err
		}
		if err := nd.Kill(); err != nil {
			return "", err
		}
		down := w.jitter(time.Second, 4*time.Second)
		sleepCtx(w.ctx, down)
		return fmt.Sprintf("node %d (leader of %s/%d), down %v", nd.ID, topic, part, down.Round(time.Millisecond)), nd.Start(ctx)
	case faultNodeStall:
		topic := w.topics[w.rng.IntN(len(w.topics))]
		nd, err := c.Leader(ctx, topic, int32(w.rng.IntN(partitions)))
		if err != nil {
			return "", err
		}
		if err := nd.Pause(); err != nil {
			return "", err
		}
		d := w.jitter(2*time.Second, 8*time.Second)
		sleepCtx(w.ctx, d)
		if err := nd.Resume(); err != nil {
			return "", err
		}
		return fmt.Sprintf("node %d stalled %v", nd.ID, d.Round(time.Millisecond)), c.WaitReady(ctx)
	case faultControllerKill:
		nd, err := c.ActiveController(ctx)
		if err != nil {
			return "", err
		}
		if err := nd.Kill(); err != nil {
			return "", err
		}
		down := w.jitter(time.Second, 4*time.Second)
		sleepCtx(w.ctx, down)
		return fmt.Sprintf("controller node %d, down %v", nd.ID, down.Round(time.Millisecond)), nd.Start(ctx)
	case faultTxnCoordKill:
		if !w.mode.transactional {
			return "", fmt.Errorf("%s needs -mode exactly-once", kind)
		}
		key, err := sysid.Key(ctx, w.dsn, slotName) // "<system id>/<slot>"
		if err != nil {
			return "", err
		}
		sys, _, _ := strings.Cut(key, "/")
		nd, err := c.TxnCoordinator(ctx, kafka.TransactionalID(kafka.DefaultTransactionalIDPrefix, sys, slotName))
		if err != nil {
			return "", err
		}
		if err := nd.Kill(); err != nil {
			return "", err
		}
		down := w.jitter(time.Second, 4*time.Second)
		sleepCtx(w.ctx, down)
		return fmt.Sprintf("coordinator node %d, down %v", nd.ID, down.Round(time.Millisecond)), nd.Start(ctx)
	case faultRollingRestart:
		start := time.Now()
		for _, nd := range c.Nodes() {
			if err := c.waitFullISR(ctx, w.topics); err != nil {
				return "", err
			}
			if err := nd.Stop(); err != nil {
				return "", err
			}
			if err := nd.Start(ctx); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("3 nodes in %v", time.Since(start).Round(time.Millisecond)), c.waitFullISR(ctx, w.topics)
	case faultTwoDown:
		return w.twoDown(ctx, c)
	}
	return "", fmt.Errorf("unknown cluster fault %q", kind)
}

// twoDown kills two of the three nodes. With one broker left, acks=all
// cannot be met (NOT_ENOUGH_REPLICAS, or no leader, or no quorum): outboxd
// must hold. While they are down the confirmed LSN must not move once the
// acks in flight have settled, although the load goes on writing; then both
// come back and outboxd must deliver everything (the caller's settle).
func (w *world) twoDown(ctx context.Context, c *apacheCluster) (string, error) {
	nodes := c.Nodes()
	rand.New(rand.NewPCG(w.seed, 2)).Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
	down := nodes[:2]
	for _, nd := range down {
		if err := nd.Kill(); err != nil {
			return "", err
		}
	}
	// Acks already on their way may still land within the producer's
	// request timeout; after that, nothing may be confirmed.
	sleepCtx(w.ctx, 3*time.Second)
	held, _ := w.mon.latestC()
	wal := w.walPosition(ctx)
	sleepCtx(w.ctx, w.jitter(4*time.Second, 7*time.Second))
	after, _ := w.mon.latestC()
	walAfter := w.walPosition(ctx)
	detail := fmt.Sprintf("nodes %d,%d down; confirmed %s held while WAL went %s→%s", down[0].ID, down[1].ID,
		harness.FormatLSN(held), harness.FormatLSN(wal), harness.FormatLSN(walAfter))
	var herr error
	if after != held {
		herr = fmt.Errorf("confirmed_flush_lsn moved from %s to %s with two of three brokers down", harness.FormatLSN(held), harness.FormatLSN(after))
	} else if walAfter <= held {
		herr = fmt.Errorf("the load wrote nothing past %s while two brokers were down: the hold was not exercised", harness.FormatLSN(held))
	}
	for _, nd := range down {
		if err := nd.StartNoWait(ctx); err != nil {
			return detail, err
		}
	}
	if err := c.Start(ctx); err != nil { // waits for both and for registration
		return detail, err
	}
	return detail, herr
}

func (w *world) walPosition(ctx context.Context) uint64 {
	conn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		return 0
	}
	defer conn.Close(context.Background())
	lsn, _ := harness.CurrentWALLSN(ctx, conn)
	return lsn
}
