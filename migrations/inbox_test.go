package migrations

import (
	"strings"
	"testing"
)

func TestInboxTablesSchema(t *testing.T) {
	sql, err := InboxTables("billing")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`CREATE SCHEMA IF NOT EXISTS "billing";`,
		`CREATE TABLE IF NOT EXISTS "billing".inbox (`,
		`PRIMARY KEY (consumer, event_id)`,
		`ON "billing".inbox (consumer, processed_at);`,
		`CREATE TABLE IF NOT EXISTS "billing".inbox_parked (`,
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("InboxTables(billing) lacks %q:\n%s", want, sql)
		}
	}
	def, err := InboxTables("")
	if err != nil || !strings.Contains(def, `"public".inbox (`) {
		t.Fatalf("default schema: %v\n%s", err, def)
	}
	// A hostile name stays one identifier.
	evil, err := InboxTables(`x"; DROP TABLE t; --`)
	if err != nil || !strings.Contains(evil, `"x""; DROP TABLE t; --".inbox`) {
		t.Fatalf("quoting: %v\n%s", err, evil)
	}
}
