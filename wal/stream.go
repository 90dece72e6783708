package wal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outboxd/pgquote"
)

// replicationRecvBuf is the replication socket's receive buffer (SO_RCVBUF;
// the kernel caps it at net.core.rmem_max).
const replicationRecvBuf = 1 << 20

// ErrTimeout is returned by Next when its deadline passes with no message. The
// stream stays usable: it is the caller's cue to send a status update.
var ErrTimeout = errors.New("wal: no message before deadline")

// ErrAheadOfServer means a position outboxd was to start from or skip to lies
// beyond the server's WAL: it cannot have come from this server.
var ErrAheadOfServer = errors.New("position beyond the server's WAL")

// ErrStreamEnded means the server ended the replication stream, as it does
// when it shuts down.
var ErrStreamEnded = errors.New("replication stream: the server ended the stream (shutting down?)")

// Connect opens a replication connection (replication=database) from an
// ordinary connection string. The same connection also runs plain SQL, which
// the slot checks use before streaming starts.
func Connect(ctx context.Context, dsn string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse postgres connection string: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	// Read the stream in large chunks: pgoutput messages are small, and the
	// default 8 KiB reads cost a syscall every few dozen events.
	// bodyCap lets Start bound what one message may cost in memory; the
	// coalescer under the buffer makes a busy stream's reads larger
	// (coalesce.go).
	bc := &bodyCap{}
	cfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		bc.co = newCoalescer(r)
		bc.src = bufio.NewReaderSize(bc.co, 256<<10)
		return pgproto3.NewFrontend(bc, w)
	}
	// A receive buffer for the longest coalescing wait (withRecvBuf).
	cfg.DialFunc = withRecvBuf(cfg.DialFunc)
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outboxd"
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, explainConnectError(cfg, err)
	}
	conn.CustomData()[capKey] = bc
	return conn, nil
}

// withRecvBuf makes dial's connections ask for a receive buffer of
// replicationRecvBuf: one that holds what a fast walsender sends during the
// longest coalescing wait (coalesce.go). With the kernel's initial one
// (128 KiB on Linux, of which half is window) a backlog draining at tens of
// MB/s shuts the window during a 1 ms wait, and the walsender blocks and
// sends in smaller pieces: a slower drain for both.
func withRecvBuf(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if rb, ok := c.(interface{ SetReadBuffer(int) error }); ok && err == nil {
			_ = rb.SetReadBuffer(replicationRecvBuf) // best effort: the kernel's default only costs speed
		}
		return c, err
	}
}

func explainConnectError(cfg *pgconn.Config, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("role %q may not open a replication connection (%s); grant it with:\n  ALTER ROLE %s WITH REPLICATION;\n%w",
			cfg.User, pgErr.Message, pgquote.Ident(cfg.User), err)
	}
	return fmt.Errorf("connect to postgres %s:%d as %q: %w", cfg.Host, cfg.Port, cfg.User, err)
}

// System is what IDENTIFY_SYSTEM reports.
type System struct {
	ID     string // the database system identifier, unique per cluster (initdb)
	WALEnd LSN    // the server's current WAL flush position
}

// Identify runs IDENTIFY_SYSTEM on a replication connection.
func Identify(ctx context.Context, conn *pgconn.PgConn) (System, error) {
	r, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return System{}, fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	return System{ID: r.SystemID, WALEnd: r.XLogPos}, nil
}

// StartOptions selects what to stream.
type StartOptions struct {
	Slot         string
	Publications []string
	// StartLSN asks the server to skip transactions that committed before it.
	// The server never goes below the slot's confirmed_flush_lsn; 0 means "from
	// the slot's position".
	StartLSN LSN
	// Messages asks pgoutput to send pg_logical_emit_message messages too.
	Messages bool
	// MaxBodyBytes bounds the protocol messages read whole (0: no bound):
	// a longer row or logical message is read only in part and marked
	// (Row.Oversize, Message.Oversize), so that its size never has to fit
	// in memory. Needs a connection made by Connect.
	MaxBodyBytes int
	// Binary, if set, asks for pgoutput's binary mode (PostgreSQL 14+)
	// when it passes every column type of the publications' tables under
	// the session's settings: it must report whether the caller turns the
	// type's binary send form into exactly the server's text output. Values
	// then arrive as ValueBinary. See binary.go.
	Binary func(typeOID uint32, s Settings) bool
	// Draining, if set, is told when the stream turns busy (true: a
	// backlog draining, the server sending tens of thousands of events a
	// second or more than outboxd reads at once) and when it goes quiet
	// again (false: a read waited for the server, or the stream closed), once
	// per turn, from the goroutine that reads the stream; it must be
	// quick. Needs a connection made by Connect. outboxd run switches its
	// CPU scheduling policy with it (--sched-batch).
	Draining func(draining bool)
}

// Stream is one START_REPLICATION session. It is not safe for concurrent use:
// one goroutine reads and sends status updates.
type Stream struct {
	conn     *pgconn.PgConn
	cap      *bodyCap // nil: the connection was not made by Connect
	copySeq  uint64   // CopyData messages received
	dec      *decoder
	msg      Msg
	deadline time.Time
	received LSN
	stop     func() bool
	co       *coalescer // nil: the connection was not made by Connect
}

// Start issues START_REPLICATION on a replication connection. Cancelling ctx
// wakes a blocked Next promptly; the connection stays open so that a final
// status update can still be sent.
func Start(ctx context.Context, conn *pgconn.PgConn, opts StartOptions) (*Stream, error) {
	// The replication grammar has no E'…' strings: only names of the
	// safe alphabet go into its literals.
	quoted := make([]string, len(opts.Publications))
	for i, p := range opts.Publications {
		if err := pgquote.ValidateName("publication", p); err != nil {
			return nil, err
		}
		quoted[i] = pgquote.Ident(p)
	}
	args := []string{
		"proto_version '1'",
		"publication_names " + pgquote.Literal(strings.Join(quoted, ",")),
	}
	if opts.Messages {
		args = append(args, "messages 'true'")
	}
	var binary binaryFunc
	var settings Settings
	if opts.Binary != nil {
		on, s, err := chooseBinary(ctx, conn, opts.Publications, opts.Binary)
		if err != nil {
			return nil, err
		}
		if on {
			args = append(args, "binary 'true'")
			binary, settings = opts.Binary, s
		}
	}
	// PostgreSQL lets a logical slot start past its own WAL, and would then
	// take the client's confirmations from there: one bogus LSN (a forged
	// checkpoint) would skip every event to come. Never start beyond the
	// server's position.
	sys, err := Identify(ctx, conn)
	if err != nil {
		return nil, err
	}
	if opts.StartLSN > sys.WALEnd {
		return nil, fmt.Errorf("%w: start position %s is beyond the server's WAL position %s (system %s)", ErrAheadOfServer, opts.StartLSN, sys.WALEnd, sys.ID)
	}
	err = pglogrepl.StartReplication(ctx, conn, pgquote.Ident(opts.Slot), opts.StartLSN,
		pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication, PluginArgs: args})
	if err != nil {
		return nil, fmt.Errorf("START_REPLICATION on slot %q: %w", opts.Slot, err)
	}
	s := &Stream{conn: conn, dec: newDecoder(), received: opts.StartLSN}
	s.dec.binary, s.dec.settings = binary, settings
	if bc, ok := conn.CustomData()[capKey].(*bodyCap); ok {
		s.cap = bc
		bc.setMax(opts.MaxBodyBytes)
		if bc.co != nil {
			bc.co.on = true
			bc.co.draining, bc.co.onDrain = false, opts.Draining
			s.co = bc.co
		}
	}
	s.stop = context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(time.Now()) })
	return s, nil
}

// Binary reports whether the session streams pgoutput's binary mode.
func (s *Stream) Binary() bool { return s.dec.binary != nil }

// Received is the highest WAL position the server has reported so far.
func (s *Stream) Received() LSN { return s.received }

// Next returns the next decoded message, or ErrTimeout once deadline passes.
// The returned Msg and everything it points into are reused by the next call.
func (s *Stream) Next(ctx context.Context, deadline time.Time) (*Msg, error) {
	if !deadline.Equal(s.deadline) {
		if err := s.conn.Conn().SetReadDeadline(deadline); err != nil {
			return nil, fmt.Errorf("replication stream: %w", err)
		}
		s.deadline = deadline
	}
	for {
		// Checked after setting the deadline: a cancellation that lands in
		// between has moved the deadline to now, so the read returns at once.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		raw, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				return nil, ErrTimeout
			}
			return nil, fmt.Errorf("replication stream: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.CopyData:
			s.copySeq++
			oversize := 0
			if s.cap != nil {
				oversize = s.cap.cutSize(s.copySeq)
			}
			if ok, err := s.handle(m.Data, oversize); ok || err != nil {
				return &s.msg, err
			}
		case *pgproto3.ErrorResponse:
			return nil, fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.NoticeResponse:
		case *pgproto3.CopyDone, *pgproto3.CommandComplete:
			return nil, ErrStreamEnded
		default:
			return nil, fmt.Errorf("replication stream: unexpected %T", raw)
		}
	}
}

func (s *Stream) handle(data []byte, oversize int) (bool, error) {
	if len(data) == 0 {
		return false, errShort
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, fmt.Errorf("replication stream: %w", err)
		}
		s.received = max(s.received, ka.ServerWALEnd)
		s.msg.Kind = KindKeepalive
		s.msg.Keepalive = Keepalive{WALEnd: ka.ServerWALEnd, ServerTime: ka.ServerTime, ReplyRequested: ka.ReplyRequested}
		return true, nil
	case pglogrepl.XLogDataByteID:
		if len(data) < 25 {
			return false, fmt.Errorf("replication stream: XLogData of %d bytes", len(data))
		}
		start := LSN(uint64(data[1])<<56 | uint64(data[2])<<48 | uint64(data[3])<<40 | uint64(data[4])<<32 |
			uint64(data[5])<<24 | uint64(data[6])<<16 | uint64(data[7])<<8 | uint64(data[8]))
		s.received = max(s.received, start)
		s.msg.WALStart = start
		return s.dec.decode(data[25:], &s.msg, oversize)
	default:
		return false, fmt.Errorf("replication stream: unknown CopyData type %q", data[0])
	}
}

// SendStatus reports that everything up to flushed has been durably handled:
// the server advances the slot's confirmed_flush_lsn to it and may recycle
// older WAL. flushed must never exceed what the caller has really handled.
func (s *Stream) SendStatus(flushed LSN, replyRequested bool) error {
	if flushed == 0 {
		return errors.New("send standby status update: refusing to confirm LSN 0")
	}
	// A peer that stopped reading must not block the relay forever.
	if err := s.conn.Conn().SetWriteDeadline(time.Now().Add(statusWriteTimeout)); err != nil {
		return fmt.Errorf("send standby status update: %w", err)
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(s.received, flushed),
		// pglogrepl replaces a zero flush position with the write position;
		// callers always pass a real one (the slot's start at worst).
		WALFlushPosition: flushed,
		WALApplyPosition: flushed,
		ReplyRequested:   replyRequested,
	})
	if err != nil {
		return fmt.Errorf("send standby status update: %w", err)
	}
	return nil
}

const statusWriteTimeout = 10 * time.Second

// Close releases the stream's hooks, and tells Draining the stream is quiet
// if it was busy. The caller owns and closes the connection.
func (s *Stream) Close() {
	s.stop()
	if s.co != nil {
		s.co.drain(false)
		s.co.onDrain = nil
	}
}

// End ends the replication COPY as the protocol does, after a final status
// update: it sends CopyDone and reads (and drops) what the server still
// sends until it is ready for a query again, or ctx ends.
//
// Why not just close the connection: the server keeps sending WAL while a
// shutting-down outboxd waits for its acks without reading, so the
// walsender is blocked writing, with the socket full. Closing with data
// unread makes the kernel answer with a reset, and a walsender that wakes
// to the reset fails its pending write and exits before it reads the status
// update queued ahead of it: the slot stays where the previous update left
// it, and the next start sends everything since again. After CopyDone the
// walsender takes every message before it, the status update included, and
// stops; reading what it still sends lets it get there.
func (s *Stream) End(ctx context.Context) error {
	s.stop() // ctx's cancellation no longer moves the read deadline
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(endTimeout)
	}
	nc := s.conn.Conn()
	if err := errors.Join(nc.SetWriteDeadline(deadline), nc.SetReadDeadline(deadline)); err != nil {
		return fmt.Errorf("replication stream: end: %w", err)
	}
	s.deadline = deadline
	fe := s.conn.Frontend()
	fe.Send(&pgproto3.CopyDone{})
	if err := fe.Flush(); err != nil {
		return fmt.Errorf("replication stream: end: send CopyDone: %w", err)
	}
	for {
		raw, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			return fmt.Errorf("replication stream: end: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.CopyData: // WAL sent before the server saw CopyDone
			s.copySeq++
			if s.cap != nil {
				s.cap.cutSize(s.copySeq)
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: end: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.ReadyForQuery:
			return nil
		}
	}
}

// endTimeout bounds End when its context has no deadline.
const endTimeout = 5 * time.Second
