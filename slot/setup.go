package slot

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/pgquote"
	"github.com/outboxd/outboxd/wal"
)

// SetupError is a server configuration problem outboxd cannot fix by itself.
// It says what is wrong and the SQL that fixes it.
type SetupError struct {
	Problem string
	Fix     string
}

func (e *SetupError) Error() string {
	if e.Fix == "" {
		return e.Problem
	}
	return e.Problem + "\nfix:\n  " + strings.ReplaceAll(e.Fix, "\n", "\n  ")
}

// BusyError says the slot is streaming to another process. It is transient
// from outboxd's point of view: the caller retries with backoff.
type BusyError struct {
	Slot   string
	PID    int
	Holder string // application_name, client address and start time, if visible
	// SilenceUnknown: the holder is an outboxd whose silence the querying
	// role cannot see (no pg_read_all_stats), so it is never found stale.
	SilenceUnknown bool
}

func (e *BusyError) Error() string {
	msg := fmt.Sprintf("replication slot %q is active for PID %d", e.Slot, e.PID)
	if e.Holder != "" {
		msg += " (" + e.Holder + ")"
	}
	return msg + "; another outboxd (or consumer) holds it. Stop it, or if it is stale: SELECT pg_terminate_backend(" + strconv.Itoa(e.PID) + ");"
}

// Info is the slot Prepare checked, with the session's server facts.
type Info struct {
	Slot
	// ServerVersion is server_version_num; SystemID and Timeline come from
	// IDENTIFY_SYSTEM.
	ServerVersion int
	SystemID      string
	Timeline      int32
	// SessionPID is the backend PID of the connection Prepare ran on: the
	// walsender's PID once it streams.
	SessionPID int
	// ServerStart is pg_postmaster_start_time(): with SystemID and Timeline
	// it tells the relay whether the server is the one its previous session
	// streamed from (a restore or a failover restarts it).
	ServerStart string
	// PreviousEnd is where Config.Previous's timeline ended in this
	// server's timeline history (TIMELINE_HISTORY): this server's WAL
	// before it is the WAL the previous session streamed (a promoted
	// standby replayed it). 0: not a later timeline of the same cluster,
	// or not in its history.
	PreviousEnd wal.LSN
}

// Server identifies the server incarnation a session streamed from.
func (i Info) Server() string {
	return fmt.Sprintf("%s/%d/%s", i.SystemID, i.Timeline, i.ServerStart)
}

var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// ValidateName checks a slot name against PostgreSQL's rules.
func ValidateName(name string) error {
	if !slotNameRE.MatchString(name) {
		return fmt.Errorf("invalid slot name %q: use 1-63 lower-case letters, digits and underscores", name)
	}
	return nil
}

// Config names what Prepare checks.
type Config struct {
	Slot        string
	Publication string
	// TakeOver is the walsender PID of this process's previous session, or 0.
	// If that walsender still holds the slot (its client vanished without a
	// FIN: a partition, a dead NAT entry), it is terminated rather than waited
	// for until wal_sender_timeout.
	TakeOver int
	// Failover is --slot-failover: auto (""), true or false.
	Failover string
	// Progress, if set, is checked against the server before streaming: a
	// missing slot outboxd confirmed before, another cluster, or a server
	// behind what was published is a gap (gap.go). AcceptGap lets it pass.
	Progress  ProgressSource
	AcceptGap bool
	// Unroutable, if set, says why the router could not turn rows of a
	// table into records ("" if it can): every table of the publication is
	// checked before streaming (router.Router.Unroutable).
	Unroutable func(rel *wal.Relation) string
	// StaleAfter: an outboxd walsender (application_name outboxd) whose
	// client has not replied for this long is dead (outboxd replies every
	// few seconds), e.g. left by a killed process; it is terminated. 0 never.
	StaleAfter time.Duration
	// Silence measures that silence across the caller's looks at the
	// slot (a standby's polls, then this one): nil, a single look, never
	// finds a holder silent.
	Silence *Silence
	// Previous is the server the caller's previous session streamed from
	// (system identifier and timeline; zero: none): if this server is a
	// later timeline of it, Info.PreviousEnd says where that timeline
	// ended in this server's history.
	Previous Info
}

// Prepare runs on a replication connection before streaming. It checks
// wal_level, the publication and the slot, creates the slot (pgoutput) if it is
// missing, and returns the slot's state. created reports a new slot.
func Prepare(ctx context.Context, conn *pgconn.PgConn, cfg Config) (info Info, created bool, err error) {
	if err := ValidateName(cfg.Slot); err != nil {
		return Info{}, false, err
	}
	if err := pgquote.ValidateName("publication", cfg.Publication); err != nil {
		return Info{}, false, &SetupError{Problem: "--publication: " + err.Error()}
	}
	if err := checkWALLevel(ctx, conn); err != nil {
		return Info{}, false, err
	}
	if err := checkPublication(ctx, conn, cfg.Publication); err != nil {
		return Info{}, false, err
	}
	if err := checkTables(ctx, conn, cfg); err != nil {
		return Info{}, false, err
	}
	db, err := queryOne(ctx, conn, "SELECT current_database(), pg_backend_pid(), pg_postmaster_start_time()")
	if err != nil {
		return Info{}, false, err
	}
	version, err := serverVersion(ctx, conn)
	if err != nil {
		return Info{}, false, err
	}
	failover, err := wantFailover(cfg.Failover, version)
	if err != nil {
		return Info{}, false, err
	}
	row, found, err := Get(ctx, conn, cfg.Slot)
	info = Info{Slot: row}
	if err != nil {
		return Info{}, false, err
	}
	srv, err := identify(ctx, conn)
	if err != nil {
		return Info{}, false, err
	}
	srv.slot = row.ConfirmedFlush
	if err := guard(ctx, conn, cfg, found, srv); err != nil {
		return Info{}, false, err
	}
	if prev := cfg.Previous; prev.SystemID == srv.systemID && prev.Timeline != 0 && prev.Timeline < srv.timeline {
		h, err := pglogrepl.TimelineHistory(ctx, conn, srv.timeline)
		if err != nil {
			return Info{}, false, fmt.Errorf("TIMELINE_HISTORY %d: %w", srv.timeline, err)
		}
		if end, diverged := switchPoint(string(h.Content), prev.Timeline); !diverged {
			info.PreviousEnd = end
		}
	}
	if !found {
		if err := createSlot(ctx, conn, cfg.Slot, failover); err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42710" { // duplicate_object: lost a race, inspect again
				return Info{}, false, fmt.Errorf("create replication slot %q: %w", cfg.Slot, err)
			}
		} else {
			created = true
		}
		if info.Slot, _, err = Get(ctx, conn, cfg.Slot); err != nil {
			return Info{}, false, err
		}
	}
	if failover && !info.Failover && !info.Active && info.Type == "logical" {
		if err := makeFailover(ctx, conn, cfg.Slot); err != nil {
			return Info{}, false, err
		}
		if info.Slot, _, err = Get(ctx, conn, cfg.Slot); err != nil {
			return Info{}, false, err
		}
	}
	cfg.Silence.Observe(&info.Slot)
	if info.Active && (cfg.TakeOver != 0 && info.ActivePID == cfg.TakeOver || info.Stale(cfg.StaleAfter)) {
		if info.Slot, err = takeOver(ctx, conn, info.Slot); err != nil {
			return Info{}, false, err
		}
	}
	info.SessionPID, _ = strconv.Atoi(db[1])
	info.ServerVersion, info.SystemID, info.Timeline, info.ServerStart = version, srv.systemID, srv.timeline, db[2]
	return info, created, checkSlot(info, db[0], db[1])
}

// takeOver terminates our own previous, stale walsender and waits (bounded)
// until the slot is free.
func takeOver(ctx context.Context, conn *pgconn.PgConn, info Slot) (Slot, error) {
	if _, err := query(ctx, conn, "SELECT pg_terminate_backend("+strconv.Itoa(info.ActivePID)+")"); err != nil {
		return info, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for info.Active && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		var err error
		if info, _, err = Get(ctx, conn, info.Name); err != nil {
			return info, err
		}
	}
	return info, nil
}

func checkWALLevel(ctx context.Context, conn *pgconn.PgConn) error {
	row, err := queryOne(ctx, conn, "SHOW wal_level")
	if err != nil {
		return err
	}
	if row[0] != "logical" {
		return &SetupError{
			Problem: fmt.Sprintf("wal_level is %q; logical decoding needs wal_level = logical", row[0]),
			Fix:     "ALTER SYSTEM SET wal_level = logical;\n-- then restart PostgreSQL (on managed services set the equivalent parameter, e.g. rds.logical_replication = 1)",
		}
	}
	return nil
}

func checkPublication(ctx context.Context, conn *pgconn.PgConn, pub string) error {
	rows, err := query(ctx, conn, "SELECT puballtables, pubinsert, (SELECT count(*) FROM pg_publication_tables t WHERE t.pubname = p.pubname) FROM pg_publication p WHERE pubname = "+pgquote.Literal(pub))
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return &SetupError{
			Problem: fmt.Sprintf("publication %q does not exist in this database", pub),
			Fix: fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE public.outbox WITH (publish = 'insert');\n-- or run: outboxd setup --publication %s --table public.outbox",
				pgquote.Ident(pub), pub),
		}
	}
	if rows[0][1] != "t" {
		return &SetupError{
			Problem: fmt.Sprintf("publication %q does not publish INSERTs, so no outbox event would ever arrive", pub),
			Fix:     fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert');", pgquote.Ident(pub)),
		}
	}
	if rows[0][0] != "t" && rows[0][2] == "0" {
		return &SetupError{
			Problem: fmt.Sprintf("publication %q publishes no table", pub),
			Fix:     fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE public.outbox;", pgquote.Ident(pub)),
		}
	}
	return nil
}

func checkSlot(info Info, db, ownPID string) error {
	drop := fmt.Sprintf("SELECT pg_drop_replication_slot(%s);\n-- (events committed but not yet relayed through the old slot are then skipped), or pick another --slot",
		pgquote.Literal(info.Name))
	switch {
	case info.Type != "logical":
		return &SetupError{Problem: fmt.Sprintf("replication slot %q is a %s slot; outboxd needs a logical pgoutput slot", info.Name, info.Type), Fix: drop}
	case info.Plugin != "pgoutput":
		return &SetupError{Problem: fmt.Sprintf("replication slot %q uses plugin %q; outboxd needs pgoutput", info.Name, info.Plugin), Fix: drop}
	case info.Database != db:
		return &SetupError{Problem: fmt.Sprintf("replication slot %q belongs to database %q, but this connection is to %q", info.Name, info.Database, db),
			Fix: "connect --postgres to database " + pgquote.Ident(info.Database) + " or pick another --slot"}
	case info.WALStatus == "lost":
		return &SetupError{Problem: fmt.Sprintf("replication slot %q was invalidated (wal_status = lost): WAL it needed was removed, so events were lost", info.Name),
			Fix: drop + "\n-- then re-publish the missing events from the outbox table, and raise max_slot_wal_keep_size"}
	case info.Active && strconv.Itoa(info.ActivePID) != ownPID:
		return info.Busy()
	}
	return nil
}

// query runs SQL with the simple protocol (the only one a replication
// connection speaks) and returns the rows as text.
func query(ctx context.Context, conn Querier, sql string) ([][]string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", firstLine(sql), err)
	}
	var out [][]string
	for _, res := range results {
		for _, row := range res.Rows {
			r := make([]string, len(row))
			for i, v := range row {
				r[i] = string(v)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func queryOne(ctx context.Context, conn Querier, sql string) ([]string, error) {
	rows, err := query(ctx, conn, sql)
	if err != nil {
		return nil, err
	}
	if len(rows) != 1 {
		return nil, fmt.Errorf("query %q: want 1 row, got %d", firstLine(sql), len(rows))
	}
	return rows[0], nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// checkTables asks cfg.Unroutable about every table of the publication, as
// the catalog describes it now, and refuses the tables outboxd could not
// route: otherwise their first row would stop it mid-stream ("no column
// payload"), with the slot held before it.
func checkTables(ctx context.Context, conn *pgconn.PgConn, cfg Config) error {
	if cfg.Unroutable == nil {
		return nil
	}
	rows, err := query(ctx, conn, `SELECT t.schemaname, t.tablename, a.attname, a.atttypid
FROM pg_publication_tables t
JOIN pg_namespace n ON n.nspname = t.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE t.pubname = `+pgquote.Literal(cfg.Publication)+`
ORDER BY 1, 2, a.attnum`)
	if err != nil {
		return err
	}
	var bad, names []string
	check := func(ns, name string, cols []wal.Column) {
		if ns == "" {
			return
		}
		if why := cfg.Unroutable(wal.NewRelation(0, ns, name, cols)); why != "" {
			bad = append(bad, fmt.Sprintf("%s.%s: %s", ns, name, why))
			names = append(names, pgquote.Ident(ns)+"."+pgquote.Ident(name))
		}
	}
	var ns, name string
	var cols []wal.Column
	for _, r := range rows {
		if r[0] != ns || r[1] != name {
			check(ns, name, cols)
			ns, name, cols = r[0], r[1], nil
		}
		oid, _ := strconv.ParseUint(r[3], 10, 32)
		cols = append(cols, wal.Column{Name: r[2], TypeOID: uint32(oid)})
	}
	check(ns, name, cols)
	if len(bad) == 0 {
		return nil
	}
	pub := pgquote.Ident(cfg.Publication)
	return &SetupError{
		Problem: fmt.Sprintf("publication %q publishes %d table(s) whose rows outboxd cannot route as outbox events (a FOR ALL TABLES publication, such as Debezium's publication.autocreate.mode=all_tables makes, publishes every table):\n  %s",
			cfg.Publication, len(bad), strings.Join(bad, "\n  ")),
		Fix: fmt.Sprintf("publish only the outbox tables, in a publication of their own:\nCREATE PUBLICATION outboxd FOR TABLE public.outbox WITH (publish = 'insert');  -- then run with --publication outboxd\n"+
			"-- or, if %s lists tables: ALTER PUBLICATION %s DROP TABLE %s;\n-- or configure the table's columns (router/tables options) if it is an outbox", pub, pub, strings.Join(names, ", ")),
	}
}
