package wal

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/pgquote"
)

// Binary mode. pgoutput's "binary" option (PostgreSQL 14+) makes the
// walsender send each column's binary send form instead of its text output:
// a uuid as 16 bytes instead of formatting 36 characters, a timestamptz as an
// int64 instead of a time zone conversion and a date formatting. The
// walsender is the relay's bottleneck (one process, one core), so the
// formatting is better done by outboxd, whose work spreads over goroutines.
//
// The option is per session, not per column: the server sends every column
// with a send function in binary. So binary mode is asked for only when the
// caller can turn every column type of the publication's tables back into
// exactly the text the server would have sent (StartOptions.Binary), and a
// Relation message that announces a column of another type mid-session (a
// table added to the publication, an ALTER TABLE) ends the session with
// ErrBinaryUnsupported before any row of it is returned: the next session,
// started with Binary nil, streams text.

// ErrBinaryUnsupported ends a binary session at a relation whose columns the
// caller cannot render from their binary form. Start the next session without
// StartOptions.Binary.
var ErrBinaryUnsupported = errors.New("pgoutput binary mode: a column type outboxd does not render from its binary form")

// Settings are the walsender session's settings that the text form of a
// value depends on.
type Settings struct {
	ServerVersion int    // server_version_num, e.g. 150004
	TimeZone      string // timestamptz output
	DateStyle     string // timestamp and timestamptz output, e.g. "ISO, MDY"
	ByteaOutput   string // "hex" or "escape"
}

// binaryFunc says whether the caller renders type oid's binary form exactly
// as the server's text output under s.
type binaryFunc = func(oid uint32, s Settings) bool

// chooseBinary reads the session's settings and the column types of the
// publications' tables, and reports whether every type passes ok. It runs
// on the replication connection before START_REPLICATION (a replication
// connection in database mode runs simple-protocol SQL).
func chooseBinary(ctx context.Context, conn *pgconn.PgConn, pubs []string, ok binaryFunc) (bool, Settings, error) {
	var s Settings
	if len(pubs) == 0 {
		return false, s, nil
	}
	quoted := make([]string, len(pubs))
	for i, p := range pubs {
		quoted[i] = pgquote.Literal(p) // validated by Start
	}
	// Every column of every published table, including columns a column
	// list leaves out: a superset can only choose text needlessly.
	q := `SELECT current_setting('server_version_num'), current_setting('TimeZone'), current_setting('DateStyle'), current_setting('bytea_output'),
  coalesce((SELECT string_agg(DISTINCT a.atttypid::text, ',')
    FROM pg_publication_tables p
    JOIN pg_namespace n ON n.nspname = p.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE p.pubname IN (` + strings.Join(quoted, ",") + `)), '')`
	res, err := conn.Exec(ctx, q).ReadAll()
	if err != nil {
		return false, s, fmt.Errorf("read the publication's column types for pgoutput binary mode: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 5 {
		return false, s, errors.New("read the publication's column types for pgoutput binary mode: unexpected result shape")
	}
	row := res[0].Rows[0]
	s.ServerVersion, _ = strconv.Atoi(string(row[0]))
	s.TimeZone, s.DateStyle, s.ByteaOutput = string(row[1]), string(row[2]), string(row[3])
	if s.ServerVersion < 140000 {
		return false, s, nil // no binary option before PostgreSQL 14
	}
	if len(row[4]) == 0 {
		return false, s, nil // nothing published (yet): text, which always works
	}
	for _, f := range strings.Split(string(row[4]), ",") {
		oid, err := strconv.ParseUint(f, 10, 32)
		if err != nil || !ok(uint32(oid), s) {
			return false, s, nil
		}
	}
	return true, s, nil
}

// checkBinary is the decoder's check of a Relation message in binary mode.
func (d *decoder) checkBinary(rel *Relation) error {
	if d.binary == nil {
		return nil
	}
	for _, c := range rel.Columns {
		if !d.binary(c.TypeOID, d.settings) {
			return fmt.Errorf("%w: column %q of %s has type OID %d; outboxd reconnects and streams text",
				ErrBinaryUnsupported, c.Name, rel.QualifiedName(), c.TypeOID)
		}
	}
	return nil
}
