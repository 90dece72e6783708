package migrations

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite inbox_events.sql from InboxEventsTable(\"public\")")

// The checked-in file is what services without outboxd run: it must be
// exactly the SQL outboxd inbox --create-tables runs.
func TestInboxEventsFileIsCurrent(t *testing.T) {
	want, err := InboxEventsTable("public")
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(InboxEventsFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(InboxEventsFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s differs from InboxEventsTable(\"public\"): run go test ./migrations -run TestInboxEventsFileIsCurrent -update", InboxEventsFile)
	}
}

func TestInboxEventsTableSchema(t *testing.T) {
	sql, err := InboxEventsTable(`x"; DROP TABLE t; --`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "x""; DROP TABLE t; --".inbox_events (`,
		`FUNCTION "x""; DROP TABLE t; --".inbox_claim(`,
		`FOR UPDATE OF e SKIP LOCKED`,
		`PRIMARY KEY (consumer, event_id)`,
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("InboxEventsTable lacks %q", want)
		}
	}
	if strings.Contains(sql, "%!") {
		t.Errorf("a formatting verb went wrong:\n%s", sql)
	}
	if _, err := InboxEventsTable("a\x00b"); err == nil {
		t.Error("a NUL in the schema name was accepted")
	}
}
