package main

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestInboxCommandValidation(t *testing.T) {
	code, _, errOut := runCmd(t, map[string]string{"PGHOST": "", "PGDATABASE": "", "PGUSER": "", "PGSERVICE": ""}, "inbox")
	for _, want := range []string{"--postgres (OUTBOXD_POSTGRES)", "--broker (OUTBOXD_BROKER) is required; fix: --broker kafka://",
		"--group (OUTBOXD_GROUP) is required", "--topics (OUTBOXD_TOPICS) is required"} {
		if code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("exit %d, want %q in:\n%s", code, want, errOut)
		}
	}
	code, _, errOut = runCmd(t, map[string]string{"OUTBOXD_BROKER": "ftp://x", "OUTBOXD_GROUP": "g", "OUTBOXD_TOPICS": "t", "OUTBOXD_POSTGRES": "postgres://u:s3cr3tpw@127.0.0.1:1/db"}, "inbox", "--batch", "0")
	if code != 1 || !strings.Contains(errOut, `--broker scheme "ftp"`) || !strings.Contains(errOut, "--batch must be at least 1") || strings.Contains(errOut, "s3cr3tpw") {
		t.Errorf("exit %d:\n%s", code, errOut)
	}
	code, out, _ := runCmd(t, nil, "inbox", "--help")
	if code != 0 || !strings.Contains(out, "Usage: outboxd inbox [options]") || !strings.Contains(out, "--broker  [OUTBOXD_BROKER]") {
		t.Errorf("inbox --help: exit %d\n%s", code, out)
	}
}

func TestInboxPrintSQL(t *testing.T) {
	code, out, errOut := runCmd(t, nil, "inbox", "--print-sql", "--inbox-schema", "billing")
	if code != 0 || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "billing".inbox (`) || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "billing".inbox_events (`) {
		t.Errorf("exit %d\n%s%s", code, out, errOut)
	}
}

func TestInboxBroker(t *testing.T) {
	for raw, want := range map[string]string{"kafka://h1:9092,h2:9093": "kafka", "nats://h:4222": "nats", "amqps://u:p@h/v": "amqps"} {
		if got, err := inboxBroker(raw); err != nil || got != want {
			t.Errorf("inboxBroker(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, raw := range []string{"h1:9092", "redis://h"} {
		if _, err := inboxBroker(raw); err == nil || !strings.Contains(err.Error(), "fix: --broker kafka://") {
			t.Errorf("inboxBroker(%q): %v", raw, err)
		}
	}
	// RabbitMQ needs no group, but a name.
	code, _, errOut := runCmd(t, map[string]string{"OUTBOXD_BROKER": "amqp://h/", "OUTBOXD_TOPICS": "q", "OUTBOXD_POSTGRES": "postgres://127.0.0.1:1/db"}, "inbox")
	if code != 1 || !strings.Contains(errOut, "--name (OUTBOXD_NAME) or --group is required") || strings.Contains(errOut, "--group (OUTBOXD_GROUP)") {
		t.Errorf("exit %d:\n%s", code, errOut)
	}
}

// Whatever bytes a key or header holds, the row is storable: PostgreSQL
// text refuses NUL and invalid UTF-8, jsonb refuses \u0000.
func TestInboxTextIsStorable(t *testing.T) {
	if got := pgText("acct-1"); got != "acct-1" {
		t.Errorf("pgText changed valid text: %q", got)
	}
	if got := pgText("a\x00b\xffc"); got != "a\uFFFDb\uFFFDc" {
		t.Errorf("pgText = %q", got)
	}
	j, err := headersJSON([]kgo.RecordHeader{{Key: "id", Value: []byte("1")}, {Key: "id", Value: []byte("2")}, {Key: "x\x00", Value: []byte{0xff, 0}}})
	if err != nil || j != `{"id":"1","x`+"\uFFFD"+`":"`+"\uFFFD\uFFFD"+`"}` {
		t.Errorf("headersJSON = %s, %v", j, err)
	}
}
