package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// runCmd runs one outboxd command line through the dispatcher.
func runCmd(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = dispatch(context.Background(), args, &out, &errb, func(k string) string { return env[k] })
	return code, out.String(), errb.String()
}

func TestSetupHelp(t *testing.T) {
	code, out, _ := runCmd(t, nil, "setup", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"Usage: outboxd setup [options]", "--postgres  [OUTBOXD_POSTGRES]", "--table  [OUTBOXD_TABLE] (default public.outbox)",
		"--publication  [OUTBOXD_PUBLICATION] (default outboxd)", "--slot  [OUTBOXD_SLOT] (default outboxd)", "--role  [OUTBOXD_ROLE]",
		"--no-slot  [OUTBOXD_NO_SLOT]", "--print  [OUTBOXD_PRINT]"} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
}

func TestSetupValidation(t *testing.T) {
	code, _, errOut := runCmd(t, nil, "setup")
	if code != 1 || !strings.Contains(errOut, "--postgres (OUTBOXD_POSTGRES) is required") {
		t.Errorf("exit %d: %s", code, errOut)
	}
	code, _, errOut = runCmd(t, nil, "setup", "--print", "--table", "a.b.c", "--slot", "Bad-Name")
	if code != 1 || !strings.Contains(errOut, "--table") || !strings.Contains(errOut, "--slot: invalid slot name") {
		t.Errorf("exit %d: %s", code, errOut)
	}
	// --no-slot skips the slot name check.
	if code, _, errOut = runCmd(t, nil, "setup", "--print", "--no-slot", "--slot", "Bad-Name"); code != 0 {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

func TestSetupPrint(t *testing.T) {
	env := map[string]string{"OUTBOXD_PUBLICATION": "events_pub"}
	code, out, errOut := runCmd(t, env, "setup", "--print", "--table", "app.Outbox", "--slot", "relay1", "--role", "outboxd_app")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Logf("setup --print:\n%s", out)
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS app."Outbox" (`,
		`CREATE PUBLICATION "events_pub" FOR TABLE app."Outbox" WITH (publish = 'insert');`,
		`format('%I.%I', schemaname, tablename) = 'app."Outbox"'`,
		`CREATE ROLE "outboxd_app" WITH LOGIN REPLICATION;`,
		`GRANT USAGE ON SCHEMA app TO "outboxd_app";`,
		`GRANT SELECT ON app."Outbox" TO "outboxd_app";`,
		`SELECT pg_create_logical_replication_slot('relay1', 'pgoutput')`,
		"-- ---- 001_outbox.sql ----", "-- ---- 003_publication.sql ----", "-- ---- 004_role.sql ----", "-- ---- replication slot ----",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--print output lacks %q", want)
		}
	}
	if strings.Contains(out, "headers       jsonb") {
		t.Error("the plain table must not have a headers column")
	}

	code, out, _ = runCmd(t, nil, "setup", "--print", "--no-slot", "--headers")
	if code != 0 || strings.Contains(out, "pg_create_logical_replication_slot") || strings.Contains(out, "CREATE ROLE") ||
		!strings.Contains(out, "headers       jsonb") || !strings.Contains(out, "add --role NAME") {
		t.Errorf("exit %d, --no-slot --headers output:\n%s", code, out)
	}
}
