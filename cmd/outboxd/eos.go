package main

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/sink/kafka"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// Exactly-once mode: each Kafka transaction carries whole PostgreSQL
// transactions plus a checkpoint record with the end LSN of the last one, so
// Kafka holds, atomically, the events and how far they go. A PostgreSQL
// transaction enters the watermark as committed only when its Kafka
// transaction has committed; the slot is confirmed no further.

// Kafka transactions close at a PostgreSQL commit once they are this old or
// this large, or when the stream goes quiet.
const (
	eosMaxAge     = 100 * time.Millisecond
	eosMaxRecords = 10000
)

// eosCommitTimeout bounds a Kafka commit: a reader blocked on an unreachable
// Kafka would answer no keepalive, and hold up a PostgreSQL shutdown.
const eosCommitTimeout = 10 * time.Second

// txnSink is the part of the Kafka sink that exactly-once mode uses.
type txnSink interface {
	Begin() error
	Commit(ctx context.Context, cp kafka.Checkpoints, lsn string) error
	Abort(ctx context.Context)
	Reset(ctx context.Context) error
	LoadCheckpoint(ctx context.Context, cp kafka.Checkpoints) (string, error)
}

// loadCheckpoint reads where the events already committed to Kafka end.
func loadCheckpoint(ctx context.Context, sk txnSink, cp kafka.Checkpoints) (wal.LSN, error) {
	text, err := sk.LoadCheckpoint(ctx, cp)
	if err != nil || text == "" {
		return 0, err
	}
	lsn, err := wal.ParseLSN(text)
	if err != nil {
		return 0, fmt.Errorf("checkpoint %q in %s: %w", text, cp.Topic, err)
	}
	return lsn, nil
}

// eos is one session's Kafka-transaction state, owned by the streamer.
type eos struct {
	sink    txnSink
	cp      kafka.Checkpoints
	open    bool
	started time.Time
	records int
	txns    []*slot.Txn // PostgreSQL transactions inside the open Kafka one
	ends    []wal.LSN
}

// begin opens a Kafka transaction if none is open.
func (e *eos) begin() error {
	if e.open {
		return nil
	}
	if err := e.sink.Begin(); err != nil {
		return err
	}
	e.open, e.started, e.records = true, time.Now(), 0
	return nil
}

// pgCommit records a finished PostgreSQL transaction and commits the Kafka
// transaction if it is due.
func (e *eos) pgCommit(ctx context.Context, wm *slot.Watermark, txn *slot.Txn, end wal.LSN) error {
	e.txns = append(e.txns, txn)
	e.ends = append(e.ends, end)
	if time.Since(e.started) >= eosMaxAge || e.records >= eosMaxRecords {
		return e.commit(ctx, wm)
	}
	return nil
}

// commit commits the open Kafka transaction with its checkpoint, then lets
// the watermark see its PostgreSQL transactions as committed.
func (e *eos) commit(ctx context.Context, wm *slot.Watermark) error {
	if !e.open || len(e.txns) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, eosCommitTimeout)
	defer cancel()
	if err := e.sink.Commit(cctx, e.cp, e.ends[len(e.ends)-1].String()); err != nil {
		e.reset()
		return err
	}
	for i, t := range e.txns {
		wm.Commit(t, e.ends[i])
	}
	e.reset()
	return nil
}

// abort drops the open Kafka transaction, waiting at most eosCommitTimeout
// (or ctx). A failed session resets the producer anyway.
func (e *eos) abort(ctx context.Context) {
	if e.open {
		actx, cancel := context.WithTimeout(ctx, eosCommitTimeout)
		defer cancel()
		e.sink.Abort(actx)
	}
	e.reset()
}

func (e *eos) reset() {
	e.open, e.records = false, 0
	e.txns, e.ends = e.txns[:0], e.ends[:0]
}
