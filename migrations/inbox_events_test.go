package migrations

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

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
	file, err := os.ReadFile(InboxEventsFile)
	if err != nil {
		t.Fatal(err)
	}
	// Every "public" of the file is replaced: each must be the schema.
	if n := len(regexp.MustCompile(`"public"[.;]`).FindAll(file, -1)); n != strings.Count(string(file), `"public"`) {
		t.Errorf(`%s has "public" other than as the schema of an object`, InboxEventsFile)
	}
	if pub, _ := InboxEventsTable(""); pub != string(file) {
		t.Error("InboxEventsTable(\"\") is not the file")
	}
	if _, err := InboxEventsTable("a\x00b"); err == nil {
		t.Error("a NUL in the schema name was accepted")
	}
}
