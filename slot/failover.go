package slot

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/pgquote"
)

// Failover modes of Config.Failover (--slot-failover).
const (
	FailoverAuto  = "auto"  // a failover slot when the server supports it (PostgreSQL 17+)
	FailoverTrue  = "true"  // a failover slot, or a startup error on older servers
	FailoverFalse = "false" // an ordinary slot; an existing slot is left as it is
)

// failoverVersion is the first server_version_num with failover slots:
// PostgreSQL 17 copies them to standbys that set sync_replication_slots, so
// the slot, and its position, survives a promotion.
const failoverVersion = 170000

// wantFailover decides whether the slot should be a failover slot on a
// server of version num (server_version_num).
func wantFailover(mode string, num int) (bool, error) {
	switch mode {
	case FailoverFalse:
		return false, nil
	case FailoverTrue:
		if num < failoverVersion {
			return false, &SetupError{
				Problem: fmt.Sprintf("--slot-failover true needs PostgreSQL 17 or later (failover slots); this server is %s", versionText(num)),
				Fix:     "upgrade PostgreSQL, or run with --slot-failover auto (the default) or false",
			}
		}
		return true, nil
	case "", FailoverAuto:
		return num >= failoverVersion, nil
	}
	return false, fmt.Errorf("--slot-failover %q: want auto, true or false", mode)
}

// versionText renders a server_version_num: 170004 → "17.4".
func versionText(num int) string {
	return strconv.Itoa(num/10000) + "." + strconv.Itoa(num%10000)
}

// serverVersion reads server_version_num.
func serverVersion(ctx context.Context, conn *pgconn.PgConn) (int, error) {
	row, err := queryOne(ctx, conn, "SHOW server_version_num")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(row[0])
}

// createSlot creates a pgoutput slot without a snapshot (the outbox needs
// none), as a failover slot if asked. The option-list syntax exists since
// PostgreSQL 15, FAILOVER since 17.
func createSlot(ctx context.Context, conn *pgconn.PgConn, name string, failover bool) error {
	opts := "SNAPSHOT 'nothing'"
	if failover {
		opts += ", FAILOVER true"
	}
	_, err := conn.Exec(ctx, fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (%s)", pgquote.Ident(name), opts)).ReadAll()
	return err
}

// makeFailover turns an existing, inactive slot into a failover slot
// (ALTER_REPLICATION_SLOT, PostgreSQL 17+). A slot another process took in
// the meantime is left alone: checkSlot reports it busy.
func makeFailover(ctx context.Context, conn *pgconn.PgConn, name string) error {
	_, err := conn.Exec(ctx, fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)", pgquote.Ident(name))).ReadAll()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use
		return nil
	}
	if err != nil {
		return fmt.Errorf("making replication slot %q a failover slot (ALTER_REPLICATION_SLOT … (FAILOVER true)): %w", name, err)
	}
	return nil
}
