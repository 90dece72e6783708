package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewDatabase (re)creates database name and returns its superuser DSN. An
// existing database of that name is dropped first, after terminating its
// backends (walsenders included) and dropping its replication slots.
func (p *Postgres) NewDatabase(ctx context.Context, name string) (string, error) {
	if name == p.adminDB {
		return "", fmt.Errorf("new database: refusing to recreate the admin database %q", name)
	}
	conn, err := p.Connect(ctx, p.adminDB)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if _, err := conn.Exec(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
		name); err != nil {
		return "", fmt.Errorf("terminating backends of %q: %w", name, err)
	}
	if err := dropSlots(ctx, conn, name); err != nil {
		return "", err
	}
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("dropping database %q: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", fmt.Errorf("creating database %q: %w", name, err)
	}
	return p.DSN(name), nil
}

// dropSlots drops every replication slot of database db. A terminated
// walsender releases its slot asynchronously, so this polls until none is
// left.
func dropSlots(ctx context.Context, conn *pgx.Conn, db string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var left int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, db).Scan(&left)
		if err != nil {
			return fmt.Errorf("listing slots of %q: %w", db, err)
		}
		if left == 0 {
			return nil
		}
		// Errors are expected while a slot is being released; retry.
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			WHERE database = $1 AND active_pid IS NOT NULL`, db)
		_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE database = $1 AND NOT active`, db)
		select {
		case <-ctx.Done():
			return fmt.Errorf("dropping %d slot(s) of %q: %w", left, db, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
