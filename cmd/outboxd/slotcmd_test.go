package main

import (
	"strings"
	"testing"
)

func TestSlotCommandUsage(t *testing.T) {
	code, _, errOut := runCmd(t, nil, "slot")
	if code == 0 || !strings.Contains(errOut, "Usage: outboxd slot <sub-command>") || !strings.Contains(errOut, "missing sub-command") {
		t.Errorf("no sub-command: exit %d\n%s", code, errOut)
	}
	code, _, errOut = runCmd(t, nil, "slot", "frobnicate")
	if code == 0 || !strings.Contains(errOut, "drop   drop a replication slot") || !strings.Contains(errOut, `unknown sub-command "frobnicate"`) {
		t.Errorf("unknown sub-command: exit %d\n%s", code, errOut)
	}
	code, out, _ := runCmd(t, nil, "slot", "--help")
	if code != 0 || !strings.Contains(out, "Usage: outboxd slot") {
		t.Errorf("slot --help: exit %d\n%s", code, out)
	}
	code, out, _ = runCmd(t, nil, "slot", "drop", "--help")
	if code != 0 || !strings.Contains(out, "Usage: outboxd slot drop [options]") || !strings.Contains(out, "--force  [OUTBOXD_FORCE]") {
		t.Errorf("slot drop --help: exit %d\n%s", code, out)
	}
}

func TestSlotDropValidation(t *testing.T) {
	code, _, errOut := runCmd(t, nil, "slot", "drop")
	if code != 1 || !strings.Contains(errOut, "--postgres (OUTBOXD_POSTGRES) is required") || !strings.Contains(errOut, "--slot (OUTBOXD_SLOT) is required") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

// A connection error must not echo the password, whatever the driver says.
func TestOpsCommandsNeverPrintPassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:s3cr3tpw@127.0.0.1:1/db?connect_timeout=1",
		"host=127.0.0.1 port=1 user=u password='s3cr3tpw' connect_timeout=1",
		"postgres://u:s3cr3tpw@[::1:bad/db", // unparseable
	} {
		for _, args := range [][]string{{"setup"}, {"status"}, {"slot", "drop", "--slot", "x"}} {
			code, out, errOut := runCmd(t, map[string]string{"OUTBOXD_POSTGRES": dsn}, args...)
			if code == 0 {
				t.Errorf("%v with %q succeeded", args, dsn)
			}
			if strings.Contains(out+errOut, "s3cr3tpw") {
				t.Errorf("%v printed the password:\n%s%s", args, out, errOut)
			}
		}
	}
}
