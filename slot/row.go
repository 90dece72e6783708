package slot

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/pgquote"
	"github.com/outboxd/outboxd/wal"
)

// Querier runs simple-protocol SQL. *pgconn.PgConn is one: a replication
// connection (wal.Connect) speaks only the simple protocol, so the one slot
// query is written for it; an ordinary *pgx.Conn passes its PgConn().
type Querier interface {
	Exec(ctx context.Context, sql string) *pgconn.MultiResultReader
}

// Slot is a replication slot as pg_replication_slots shows it, with who
// holds it and how much WAL it costs. It is outboxd's only model of a slot:
// Prepare, the monitor, the standby's watch, `outboxd status` and `outboxd
// slot drop` all read it with List or Get.
type Slot struct {
	Name      string
	Type      string // logical or physical
	Plugin    string // "" for physical slots
	Database  string // "" for physical slots
	Active    bool
	ActivePID int // 0 when inactive
	Holder    Holder
	// ConfirmedFlush and RestartLSN are 0 where PostgreSQL shows NULL.
	ConfirmedFlush wal.LSN
	RestartLSN     wal.LSN
	// LagBytes is the current WAL position (the replayed one on a standby)
	// minus ConfirmedFlush; RetainedBytes the same minus RestartLSN. nil
	// where PostgreSQL has no value.
	LagBytes, RetainedBytes *int64
	WALStatus               string // reserved, extended, unreserved, lost; "" if unknown
	SafeWALSize             *int64 // nil: max_slot_wal_keep_size = -1 (unlimited), or lost
	// Failover: PostgreSQL 17+ copies the slot to standbys that sync slots.
	// Synced: this copy was synchronized from a primary (on a standby, or
	// on a promoted one). Both false before 17. Temporary slots are never
	// synced for good.
	Failover, Synced, Temporary bool
	// ServerTime is the server's now() when the row was read: what a
	// Silence measures the holder's silence with.
	ServerTime time.Time
}

// Holder is the process streaming from a slot, as far as pg_stat_activity
// and pg_stat_replication show it to the querying role.
type Holder struct {
	Application string // application_name
	Client      string // client address; "" for a Unix socket (or not visible)
	Since       string // backend_start as PostgreSQL prints it; "" if not visible
	// Reply is the walsender's reply mark: reply_time as PostgreSQL prints
	// it, or backend_start before the client's first reply; "" if the
	// querying role may not see pg_stat_replication's details (slotSQL).
	// Each reply changes it; its value is the client's clock and is never
	// compared with the server's (Silence).
	Reply string
	// Silent is how long the walsender's client has not replied, as a
	// Silence measured it on the server's clock; -1 if unknown.
	Silent time.Duration
}

// String is "app from addr since start", as BusyError shows it; "" when the
// holder is not visible.
func (h Holder) String() string {
	if h.Since == "" {
		return ""
	}
	client := h.Client
	if client == "" {
		client = "local socket"
	}
	return h.Application + " from " + client + " since " + h.Since
}

// Stale reports whether the holder is an outboxd walsender whose client has
// not replied for longer than after (outboxd replies every few seconds): a
// process that vanished without closing its connection. after <= 0: never.
// Silent comes from a Silence (Observe); unknown is never stale.
func (s Slot) Stale(after time.Duration) bool {
	return s.Active && after > 0 && s.Holder.Application == "outboxd" && s.Holder.Silent > after
}

// Busy is the BusyError of an active slot.
func (s Slot) Busy() *BusyError {
	return &BusyError{Slot: s.Name, PID: s.ActivePID, Holder: s.Holder.String()}
}

// slotSQL is the one query. Columns newer than PostgreSQL 15 (failover and
// synced, 17) are read through to_jsonb so that it runs on 15 to 18. On a
// standby pg_current_wal_lsn() fails; the replay position is its "now".
//
// The holder's silence comes from pg_stat_replication, whose walsender
// columns (state, reply_time) PostgreSQL shows only to superusers and
// members of pg_read_all_stats, while backend_start (from pg_stat_activity)
// stays visible to the walsender's own role. Without the state column the
// reply mark is unknown (NULL, Reply ""), never "since the session began": a
// healthy active under the least-privilege role must not look stale to its
// standby. A walsender whose client vanished is then ended by the server's
// wal_sender_timeout instead. The mark is the client's clock: only its
// changes count, timed by the server's now() (Silence).
const slotSQL = `SELECT s.slot_name, s.slot_type, s.plugin, s.database, s.active, s.active_pid,
	a.application_name, host(a.client_addr), a.backend_start,
	CASE WHEN r.state IS NOT NULL THEN coalesce(r.reply_time, r.backend_start)::text END,
	s.confirmed_flush_lsn, s.restart_lsn, c.lsn - s.confirmed_flush_lsn, c.lsn - s.restart_lsn,
	s.wal_status, s.safe_wal_size, (to_jsonb(s)->>'failover')::bool, (to_jsonb(s)->>'synced')::bool, s.temporary,
	extract(epoch FROM now())
FROM pg_replication_slots s
CROSS JOIN (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) c
LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid`

// List reads every slot of the server (all databases, physical ones too),
// ordered by name.
func List(ctx context.Context, q Querier) ([]Slot, error) {
	return list(ctx, q, slotSQL+"\nORDER BY s.slot_name")
}

// Get reads one slot; found is false if it does not exist.
func Get(ctx context.Context, q Querier, name string) (s Slot, found bool, err error) {
	slots, err := list(ctx, q, slotSQL+"\nWHERE s.slot_name = "+pgquote.Literal(name))
	if err != nil || len(slots) == 0 {
		return Slot{}, false, err
	}
	return slots[0], true, nil
}

func list(ctx context.Context, q Querier, sql string) ([]Slot, error) {
	results, err := q.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("reading pg_replication_slots: %w", err)
	}
	out := []Slot{}
	for _, res := range results {
		for _, row := range res.Rows {
			s, err := parseRow(row)
			if err != nil {
				return nil, fmt.Errorf("reading pg_replication_slots: %w", err)
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// parseRow reads one text row of slotSQL; NULL is a nil column.
func parseRow(r [][]byte) (s Slot, err error) {
	if len(r) != 20 {
		return Slot{}, fmt.Errorf("want 20 columns, got %d", len(r))
	}
	str := func(i int) string { return string(r[i]) }
	num := func(i int) *int64 {
		if r[i] == nil || err != nil {
			return nil
		}
		n, perr := strconv.ParseInt(str(i), 10, 64)
		if perr != nil {
			err = fmt.Errorf("column %d: %w", i+1, perr)
			return nil
		}
		return &n
	}
	lsn := func(i int) wal.LSN {
		if r[i] == nil || err != nil {
			return 0
		}
		l, perr := wal.ParseLSN(str(i))
		if perr != nil {
			err = fmt.Errorf("column %d: %w", i+1, perr)
		}
		return l
	}
	s = Slot{Name: str(0), Type: str(1), Plugin: str(2), Database: str(3), Active: str(4) == "t",
		Holder:    Holder{Application: str(6), Client: str(7), Since: str(8), Silent: -1},
		WALStatus: str(14), Failover: str(16) == "t", Synced: str(17) == "t", Temporary: str(18) == "t"}
	if pid := num(5); pid != nil {
		s.ActivePID = int(*pid)
	}
	s.Holder.Reply = str(9)
	if r[19] != nil {
		if secs, perr := strconv.ParseFloat(str(19), 64); perr == nil {
			s.ServerTime = time.UnixMicro(int64(secs * 1e6))
		}
	}
	s.ConfirmedFlush, s.RestartLSN = lsn(10), lsn(11)
	s.LagBytes, s.RetainedBytes, s.SafeWALSize = num(12), num(13), num(15)
	return s, err
}

// MarshalJSON writes the slot as `outboxd status --json` shows it: the
// view's column names, LSNs as PostgreSQL prints them, byte counts as
// numbers, null where PostgreSQL has none.
func (s Slot) MarshalJSON() ([]byte, error) {
	lsn := func(l wal.LSN) *string {
		if l == 0 {
			return nil
		}
		t := l.String()
		return &t
	}
	var pid *int
	if s.ActivePID != 0 {
		pid = &s.ActivePID
	}
	return json.Marshal(struct {
		Name            string  `json:"slot_name"`
		Type            string  `json:"slot_type"`
		Plugin          string  `json:"plugin"`
		Database        string  `json:"database"`
		Active          bool    `json:"active"`
		ActivePID       *int    `json:"active_pid"`
		ApplicationName string  `json:"application_name"`
		ClientAddr      string  `json:"client_addr"`
		ConfirmedFlush  *string `json:"confirmed_flush_lsn"`
		RestartLSN      *string `json:"restart_lsn"`
		LagBytes        *int64  `json:"lag_bytes"`
		RetainedBytes   *int64  `json:"retained_wal_bytes"`
		WALStatus       string  `json:"wal_status"`
		SafeWALSize     *int64  `json:"safe_wal_size_bytes"`
		Failover        bool    `json:"failover"`
		Synced          bool    `json:"synced"`
	}{s.Name, s.Type, s.Plugin, s.Database, s.Active, pid, s.Holder.Application, s.Holder.Client,
		lsn(s.ConfirmedFlush), lsn(s.RestartLSN), s.LagBytes, s.RetainedBytes, s.WALStatus, s.SafeWALSize, s.Failover, s.Synced})
}
