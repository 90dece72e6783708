package outboxd

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// replConn is a replication connection as one session uses it: the slot
// checks before streaming, START_REPLICATION, and its end. connectPG gives
// the real one; unit tests drive whole sessions with a scripted one.
type replConn interface {
	Prepare(ctx context.Context, cfg slot.Config) (info slot.Info, created bool, err error)
	Start(ctx context.Context, opts wal.StartOptions) (sessionStream, error)
	// IsClosed reports a connection that broke: the final confirmation is
	// then not sent.
	IsClosed() bool
	Close(ctx context.Context) error
}

// sessionStream is the replication stream a session reads and then closes.
type sessionStream interface {
	replStream
	Close()
}

// pgReplConn is a replication connection to PostgreSQL (wal.Connect).
type pgReplConn struct{ conn *pgconn.PgConn }

func connectPG(ctx context.Context, dsn string) (replConn, error) {
	conn, err := wal.Connect(ctx, dsn)
	return opened(conn, err, func(c *pgconn.PgConn) replConn { return pgReplConn{c} })
}

// opened wraps a new connection in its seam's type; on error the interface
// stays nil, not a wrapper around a nil connection.
func opened[C, I any](conn C, err error, wrap func(C) I) (I, error) {
	if err != nil {
		var none I
		return none, err
	}
	return wrap(conn), nil
}

func (c pgReplConn) Prepare(ctx context.Context, cfg slot.Config) (slot.Info, bool, error) {
	return slot.Prepare(ctx, c.conn, cfg)
}

func (c pgReplConn) Start(ctx context.Context, opts wal.StartOptions) (sessionStream, error) {
	s, err := wal.Start(ctx, c.conn, opts)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return s, nil
}

func (c pgReplConn) IsClosed() bool                  { return c.conn.IsClosed() }
func (c pgReplConn) Close(ctx context.Context) error { return c.conn.Close(ctx) }

// sqlConn is an ordinary connection as the monitor and a standby use it:
// the slot as pg_replication_slots shows it, the physical standbys, the
// heartbeat. pgSQLConn is the real one; unit tests script it.
type sqlConn interface {
	Slot(ctx context.Context, name string) (s slot.Slot, found bool, err error)
	// Standbys returns synchronized_standby_slots and the slots of the
	// physical standbys streaming, when slotName is a failover slot on
	// PostgreSQL 17+ (none otherwise).
	Standbys(ctx context.Context, slotName string) (listed string, slots []string, err error)
	// EmitHeartbeat writes a non-transactional logical message.
	EmitHeartbeat(ctx context.Context, prefix, content string) error
	IsClosed() bool
	Close(ctx context.Context) error
}

// pgSQLConn is an ordinary connection to PostgreSQL.
type pgSQLConn struct{ conn *pgx.Conn }

func connectSQL(ctx context.Context, dsn string) (sqlConn, error) {
	conn, err := pgx.Connect(ctx, dsn)
	return opened(conn, err, func(c *pgx.Conn) sqlConn { return pgSQLConn{c} })
}

func (c pgSQLConn) Slot(ctx context.Context, name string) (slot.Slot, bool, error) {
	return slot.Get(ctx, c.conn.PgConn(), name)
}

func (c pgSQLConn) Standbys(ctx context.Context, slotName string) (listed string, slots []string, err error) {
	err = c.conn.QueryRow(ctx, `SELECT coalesce(current_setting('synchronized_standby_slots', true), ''),
		coalesce(array_agg(s.slot_name::text ORDER BY s.slot_name) FILTER (WHERE s.slot_name IS NOT NULL), '{}')
		FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid AND s.slot_type = 'physical'
		WHERE current_setting('server_version_num')::int >= 170000
		  AND (SELECT coalesce((to_jsonb(l)->>'failover')::bool, false) FROM pg_replication_slots l WHERE l.slot_name = $1)`, slotName).
		Scan(&listed, &slots)
	return listed, slots, err
}

func (c pgSQLConn) EmitHeartbeat(ctx context.Context, prefix, content string) error {
	_, err := c.conn.Exec(ctx, `SELECT pg_logical_emit_message(false, $1, $2)`, prefix, content)
	return err
}

func (c pgSQLConn) IsClosed() bool                  { return c.conn.IsClosed() }
func (c pgSQLConn) Close(ctx context.Context) error { return c.conn.Close(ctx) }
