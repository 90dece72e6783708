package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/pgquote"
)

// checkPrerequisites checks, before setup changes anything, what it and
// `outboxd run` need from the server: a setup that creates the table and
// the publication and then fails on the slot leaves a half-done database.
// It reports every problem at once, each with its fix.
func checkPrerequisites(ctx context.Context, conn *pgx.Conn, o setupOptions) error {
	var (
		walLevel                      string
		maxSlots, usedSlots, senders  int
		slotExists, super, createRole bool
		createDB, createSchema        bool
	)
	schema, table, _ := migrations.ParseTable(o.Table)
	if err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int,
		(SELECT count(*) FROM pg_replication_slots)::int, current_setting('max_wal_senders')::int,
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1),
		r.rolsuper, r.rolsuper OR r.rolcreaterole,
		has_database_privilege(current_database(), 'CREATE') OR EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $4),
		coalesce((SELECT has_schema_privilege(n.oid, 'CREATE') FROM pg_namespace n WHERE n.nspname = $2), false)
		  OR EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $2 AND c.relname = $3)
		FROM pg_roles r WHERE r.rolname = current_user`, o.Slot, schema, table, o.Publication).
		Scan(&walLevel, &maxSlots, &usedSlots, &senders, &slotExists, &super, &createRole, &createDB, &createSchema); err != nil {
		return fmt.Errorf("checking the server before setup: %w", err)
	}
	var problems []string
	if walLevel != "logical" {
		problems = append(problems, fmt.Sprintf("wal_level is %q; logical decoding needs wal_level = logical. Fix: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL "+
			"(on managed services set the equivalent parameter, e.g. rds.logical_replication = 1)", walLevel))
	}
	if senders < 1 {
		problems = append(problems, "max_wal_senders is 0, so no replication connection is possible. Fix: ALTER SYSTEM SET max_wal_senders = 10; then restart PostgreSQL")
	}
	if !o.NoSlot && !slotExists && usedSlots >= maxSlots {
		problems = append(problems, fmt.Sprintf("max_replication_slots is %d and %d slots exist: no room for slot %s. Fix: drop an unused slot, or ALTER SYSTEM SET max_replication_slots = %d; then restart PostgreSQL",
			maxSlots, usedSlots, o.Slot, usedSlots+4))
	}
	if o.Role != "" && !createRole {
		problems = append(problems, fmt.Sprintf("--role %s: the connecting role may not create roles (CREATEROLE). Fix: connect as a role that may, or create %s yourself (setup --print shows the SQL)",
			o.Role, pgquote.Ident(o.Role)))
	}
	if !super && !createSchema {
		problems = append(problems, fmt.Sprintf("the connecting role may not create tables in schema %s. Fix: GRANT CREATE ON SCHEMA %s TO <this role>, or connect as the schema's owner", schema, schema))
	}
	if !super && !createDB {
		problems = append(problems, "the connecting role may not create publications in this database (CREATE on the database). Fix: GRANT CREATE ON DATABASE <database> TO <this role>, or connect as its owner")
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New("setup: nothing was changed; the server lacks what outboxd needs:\n  - " + strings.Join(problems, "\n  - "))
}
