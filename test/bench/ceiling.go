package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// CeilingRun is one read-only pass over a slot: what the walsender can
// deliver when the client does nothing but count.
type CeilingRun struct {
	Elapsed time.Duration // connect to the commit holding the last event
	Inserts int
	Commits int
	EndLSN  uint64 // end LSN of the last commit: what a relay must confirm
	// BeginLSN is where the last transaction starts (its Begin message's
	// WAL position, the end of the commit before): as far as Debezium ever
	// confirms, since it confirms the transaction before the one it is in.
	BeginLSN uint64
	CPU      CPUSplit
}

// readCeiling streams slot with the options outboxd uses (pgoutput
// proto_version 1, the publication, messages) and only counts: Insert
// messages, and Commit messages for their end LSN. It stops at the commit
// after the want-th insert, sending standby status updates along the way.
func (e *Env) readCeiling(ctx context.Context, w *world, slot string, want int, timeout time.Duration) (CeilingRun, error) {
	return e.readCeilingArgs(ctx, w, slot, want, timeout, nil)
}

// readCeilingArgs is readCeiling with more pgoutput options (binaryArgs).
func (e *Env) readCeilingArgs(ctx context.Context, w *world, slot string, want int, timeout time.Duration, pluginArgs []string) (CeilingRun, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	snap := e.snapshot()
	start := time.Now()
	var (
		r         CeilingRun
		walsender int
	)
	_, err := streamSlotArgs(ctx, w.dsn, slot, pluginArgs, func(pid int) { walsender = pid },
		func([]byte) { r.Inserts++ },
		func(begin, end uint64) bool {
			r.Commits++
			r.BeginLSN, r.EndLSN = begin, end
			if r.Inserts < want {
				return false
			}
			r.Elapsed = time.Since(start)
			r.CPU = e.split(snap, walsender) // while the walsender still lives
			return true
		})
	if err != nil {
		return r, fmt.Errorf("ceiling: read %d of %d inserts: %w", r.Inserts, want, err)
	}
	return r, nil
}

// streamSlot reads slot until onCommit returns true or ctx ends, calling
// onInsert with each Insert message (valid only during the call). started,
// if not nil, gets the walsender's pid once streaming started. It returns
// the walsender's pid.
func streamSlot(ctx context.Context, dsn, slot string, started func(walsender int), onInsert func(msg []byte), onCommit func(beginLSN, endLSN uint64) bool) (int, error) {
	return streamSlotArgs(ctx, dsn, slot, nil, started, onInsert, onCommit)
}

// streamSlotArgs is streamSlot with more pgoutput options.
func streamSlotArgs(ctx context.Context, dsn, slot string, pluginArgs []string, started func(walsender int), onInsert func(msg []byte), onCommit func(beginLSN, endLSN uint64) bool) (int, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return 0, err
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "bench-ceiling"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	walsender := int(conn.PID())
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: append([]string{"proto_version '1'", "publication_names 'outboxd'", "messages 'true'"}, pluginArgs...),
	})
	if err != nil {
		return walsender, fmt.Errorf("START_REPLICATION: %w", err)
	}
	if started != nil {
		started(walsender)
	}
	var (
		received, flushed uint64
		begin             uint64 // WAL position of the last Begin message
		nextStatus        = time.Now().Add(time.Second)
		status            = func() error {
			f := max(flushed, 1)
			return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: pglogrepl.LSN(max(received, f)), WALFlushPosition: pglogrepl.LSN(f), WALApplyPosition: pglogrepl.LSN(f),
			})
		}
	)
	// A read deadline, not ctx, interrupts a blocked read: cancelling a
	// pgconn read closes the connection.
	stopDeadline := context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(time.Now()) })
	defer stopDeadline()
	_ = conn.Conn().SetReadDeadline(time.Now().Add(time.Second))
	for n := 0; ; n++ {
		if n%256 == 0 && time.Now().After(nextStatus) {
			if err := status(); err != nil {
				return walsender, fmt.Errorf("status update: %w", err)
			}
			nextStatus = time.Now().Add(time.Second)
			if ctx.Err() == nil {
				_ = conn.Conn().SetReadDeadline(nextStatus)
			}
		}
		raw, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return walsender, ctx.Err()
			}
			if pgconn.Timeout(err) {
				n = -1 // send a status update next
				nextStatus = time.Now()
				continue
			}
			return walsender, err
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok {
			if er, isErr := raw.(*pgproto3.ErrorResponse); isErr {
				return walsender, pgconn.ErrorResponseToPgError(er)
			}
			continue
		}
		d := cd.Data
		if len(d) == 0 {
			return walsender, errors.New("empty CopyData")
		}
		switch d[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(d[1:])
			if err != nil {
				return walsender, err
			}
			received = max(received, uint64(ka.ServerWALEnd))
			if ka.ReplyRequested {
				if err := status(); err != nil {
					return walsender, err
				}
			}
		case pglogrepl.XLogDataByteID:
			if len(d) < 26 {
				return walsender, fmt.Errorf("XLogData of %d bytes", len(d))
			}
			received = max(received, binary.BigEndian.Uint64(d[1:9]))
			msg := d[25:]
			switch msg[0] {
			case 'B':
				begin = binary.BigEndian.Uint64(d[1:9])
			case 'I':
				onInsert(msg)
			case 'C':
				if len(msg) < 26 {
					return walsender, fmt.Errorf("commit message of %d bytes", len(msg))
				}
				flushed = binary.BigEndian.Uint64(msg[10:18])
				if onCommit(begin, flushed) {
					return walsender, status()
				}
			}
		}
	}
}

// firstColumn returns the first column's text value of a pgoutput Insert
// message ('I', relation id, 'N', column count, then per column a kind byte
// and, for 't', a length and the bytes).
func firstColumn(msg []byte) []byte {
	if len(msg) < 1+4+1+2+1+4 || msg[5] != 'N' || msg[8] != 't' {
		return nil
	}
	n := int(binary.BigEndian.Uint32(msg[9:13]))
	if n < 0 || len(msg) < 13+n {
		return nil
	}
	return msg[13 : 13+n]
}
