package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/inbox"
)

// outboxd inbox list and release say what is missing before connecting.
func TestInboxAdminRequiredOptions(t *testing.T) {
	none := func(string) string { return "" }
	for _, c := range []struct {
		verb string
		args []string
		want []string
	}{
		{"list", nil, []string{"--postgres", "--name"}},
		{"release", []string{"--postgres", "postgres://x/y", "--name", "billing"}, []string{"--key is required"}},
		{"purge", nil, []string{`unknown inbox sub-command "purge"`}},
	} {
		err := inboxAdminTo(context.Background(), &bytes.Buffer{}, none, c.verb, c.args)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s %q: error %v, want it to mention %s", c.verb, c.args, err, w)
			}
		}
	}
}

// list groups the parked aggregates by error, the largest group first.
func TestPrintParkedGroupsByError(t *testing.T) {
	at := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	printParked(&b, "billing", []inbox.ParkedAggregate{
		{Key: "k1", Events: 3, FirstID: "e1", Error: "frozen", Attempts: 5, ParkedAt: at},
		{Key: "k2", Events: 1, FirstID: "e2", Error: "bad json", Attempts: 1, ParkedAt: at},
		{Key: "k3", Events: 2, FirstID: "e3", Error: "frozen", Attempts: 5, ParkedAt: at, Released: true},
	})
	want := `error: frozen
  2 aggregates, 5 events
  key "k1"  3 events  first e1  attempts 5  parked 2026-12-02T11:00:00Z
  key "k3"  2 events  first e3  attempts 5  parked 2026-12-02T11:00:00Z  released (replaying)
error: bad json
  1 aggregates, 1 events
  key "k2"  1 events  first e2  attempts 1  parked 2026-12-02T11:00:00Z
`
	if b.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	printParked(&b, "billing", nil)
	if b.String() != "consumer billing has nothing parked\n" {
		t.Fatalf("empty: %q", b.String())
	}
}
