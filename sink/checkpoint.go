package sink

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/wal"
)

// Checkpoint says how far the events already committed to Kafka go. Events
// == 0: every transaction that committed before LSN (an end LSN) is in
// Kafka. Events > 0: a long PostgreSQL transaction was split over several
// Kafka transactions, and its first Events events (the transaction whose
// commit LSN is LSN) are in Kafka too.
//
// Xid and CommitTime identify the transaction the checkpoint names: the one
// ending at LSN (Events 0), or the one committed at LSN (Events > 0, and a
// checkpoint committed before a refused event's probe, which names the
// transaction it stops in). The position alone does not: a server restored
// from a copy of the same cluster reuses xids, and the same workload writes
// the same WAL sizes, so another transaction can end at the same LSN with
// the same xid; only the commit time tells them apart (the at-least-once
// replay ring keys on the same three, atleastonce.go). The session's boundary
// check requires all three (exactlyonce.go).
type Checkpoint struct {
	LSN    wal.LSN
	Events int
	Xid    uint32
	// CommitTime is the transaction's commit time in microseconds since
	// the Unix epoch (PostgreSQL's own precision); 0 in a record of an
	// earlier version, which named the position only (Identified).
	CommitTime int64
}

// Identified reports whether the checkpoint names its transaction (records
// of earlier versions do not).
func (c Checkpoint) Identified() bool { return c.CommitTime != 0 }

// Names reports whether the transaction with xid, committed at commitTime,
// is the one the checkpoint names.
func (c Checkpoint) Names(xid uint32, commitTime time.Time) bool {
	return c.Identified() && c.Xid == xid && c.CommitTime == commitTime.UnixMicro()
}

// Txn describes the transaction the checkpoint names, for logs and errors.
func (c Checkpoint) Txn() string {
	if !c.Identified() {
		return "no transaction named: a checkpoint of an earlier version"
	}
	return fmt.Sprintf("xid %d committed at %s", c.Xid, time.UnixMicro(c.CommitTime).UTC().Format(time.RFC3339Nano))
}

// Covers reports whether event n (0-based) of the transaction committed at
// commit is in Kafka already.
func (c Checkpoint) Covers(commit wal.LSN, n int) bool {
	return commit < c.LSN || (c.Events > 0 && commit == c.LSN && n < c.Events)
}

// String is the record value: "X/Y", or "X/Y+N" for a split transaction.
// The transaction's identity travels in the record's headers (sink/kafka),
// which earlier versions ignore.
func (c Checkpoint) String() string {
	if c.Events == 0 {
		return c.LSN.String()
	}
	return fmt.Sprintf("%s+%d", c.LSN, c.Events)
}

// ParseCheckpoint reads a checkpoint record's value.
func ParseCheckpoint(text string) (Checkpoint, error) {
	lsn, n, split := strings.Cut(text, "+")
	var c Checkpoint
	var err error
	if c.LSN, err = wal.ParseLSN(lsn); err != nil {
		return Checkpoint{}, err
	}
	if split {
		if c.Events, err = strconv.Atoi(n); err != nil || c.Events < 1 {
			return Checkpoint{}, fmt.Errorf("bad event count in checkpoint %q", text)
		}
	}
	return c, nil
}

// CheckpointWait is a checkpoint partition whose last stable offset (LSO)
// stays below its end offset: a transaction is open on it, and no
// read_committed reader gets past its first record until it ends. Kafka
// can leave such a transaction for good (a hanging transaction: a broker
// stopped during a commit, and the marker never reached the partition), so
// outboxd shows it on /status, with the commands that end it, rather than
// leave the operator to guess why a reader stalls.
type CheckpointWait struct {
	Topic        string `json:"topic"`
	Partition    int32  `json:"partition"`
	StableOffset int64  `json:"last_stable_offset"`
	EndOffset    int64  `json:"end_offset"`
	// Since is when the LSO was first seen at StableOffset.
	Since time.Time `json:"since"`
	// Waiting: outboxd itself waits for the LSO to move (it reads the
	// checkpoint and cannot tell it reached the end before). Otherwise it
	// reads past the transaction, and only read_committed readers of the
	// topic wait.
	Waiting bool `json:"outboxd_waits"`
	// Holders are the open transactions on the partition, the one the LSO
	// stops at first; empty when Kafka would not say (no Describe on the
	// topic or the transactional ids).
	Holders []TxnHolder `json:"holders"`
	// Leader is the partition leader's broker id (find-hanging --broker-id),
	// -1 if unknown.
	Leader int32 `json:"leader"`
	// Fix is what ends a hanging transaction by hand.
	Fix string `json:"fix"`
}

// TxnHolder is an open transaction on a partition, as the partition leader
// (DescribeProducers) and the transaction coordinator (ListTransactions)
// report it.
type TxnHolder struct {
	ProducerID    int64 `json:"producer_id"`
	ProducerEpoch int16 `json:"producer_epoch"`
	StartOffset   int64 `json:"start_offset"`
	// TransactionalID and State are the coordinator's: "" when it has no
	// transaction for the producer id (or would not say). A holder the
	// coordinator does not list as Ongoing is a hanging transaction: only
	// an abort marker written by hand (or by outboxd, for its own
	// transactional id) ends it.
	TransactionalID string `json:"transactional_id"`
	State           string `json:"coordinator_state"`
	// Own: the transactional id is this outboxd's.
	Own bool `json:"own"`
}

// Hanging reports whether the coordinator has no ongoing transaction for
// the holder: nothing will ever end it by itself.
func (h TxnHolder) Hanging() bool { return h.TransactionalID != "" && h.State != "Ongoing" }

// String is the /readyz reason: what holds the partition, and the fix.
func (w *CheckpointWait) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "checkpoint topic %s partition %d: last stable offset %d below end offset %d for %s", w.Topic, w.Partition, w.StableOffset, w.EndOffset,
		time.Since(w.Since).Round(time.Second))
	for i, h := range w.Holders {
		if i == 0 {
			b.WriteString(", held by")
		} else {
			b.WriteString(", and")
		}
		fmt.Fprintf(&b, " the transaction of producer id %d (epoch %d) from offset %d", h.ProducerID, h.ProducerEpoch, h.StartOffset)
		switch {
		case h.TransactionalID == "":
			b.WriteString(", transactional id unknown")
		case h.Hanging():
			fmt.Fprintf(&b, ", transactional id %s, which its coordinator no longer has open (state %s): a hanging transaction", h.TransactionalID, orNone(h.State))
		default:
			fmt.Fprintf(&b, ", transactional id %s (%s)", h.TransactionalID, h.State)
		}
	}
	if w.Waiting {
		b.WriteString("; outboxd waits for it to end")
	} else {
		b.WriteString("; outboxd reads past it, read_committed readers of the topic wait")
	}
	b.WriteString(". If it hangs, end it: ")
	b.WriteString(w.Fix)
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// CheckpointWatcher is a transactional sink that can say what holds its
// checkpoint partition (the Kafka sink). CheckpointWait returns nil while
// nothing does.
type CheckpointWatcher interface {
	CheckpointWait(ctx context.Context) (*CheckpointWait, error)
}
