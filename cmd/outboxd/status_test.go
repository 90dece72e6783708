package main

import (
	"bytes"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

func TestWriteStatus(t *testing.T) {
	r := &statusReport{
		Database: "orders", ServerVersion: "16.4", CurrentWALLSN: "0/3000000", Slot: "outboxd", SlotFound: true,
		Slots: []statusSlot{
			{Name: "outboxd", Type: "logical", Plugin: "pgoutput", Database: "orders", Active: true, ActivePID: ptr(int64(4242)),
				ApplicationName: "outboxd", ClientAddr: "10.0.0.7", ConfirmedFlush: ptr("0/2FFF000"), RestartLSN: ptr("0/2000000"),
				LagBytes: ptr(int64(4096)), RetainedBytes: ptr(int64(16 << 20)), WALStatus: "reserved", Selected: true},
			{Name: "old_debezium", Type: "logical", Plugin: "decoderbufs", Database: "orders", ConfirmedFlush: ptr("0/1000000"),
				RestartLSN: ptr("0/1000000"), LagBytes: ptr(int64(32 << 20)), RetainedBytes: ptr(int64(32 << 20)), WALStatus: "extended",
				SafeWALSize: ptr(int64(1 << 30))},
		},
		OtherSlots:  []statusSlot{{Name: "replica1", Type: "physical", RetainedBytes: ptr(int64(1 << 20))}, {Name: "x", Type: "logical", Database: "billing"}},
		Publication: statusPublication{Name: "outboxd", Exists: true, Insert: true, Tables: []string{"public.outbox", `sales."Outbox"`}},
	}
	var b bytes.Buffer
	writeStatus(&b, r)
	out := b.String()
	t.Logf("status:\n%s", out)
	for _, want := range []string{
		"database orders on PostgreSQL 16.4, current WAL 0/3000000",
		"* outboxd       pgoutput     yes     PID 4242 (outboxd, 10.0.0.7)  0/2FFF000        4.0KiB   16.0MiB       reserved    unlimited",
		"  old_debezium  decoderbufs  no      -                             0/1000000        32.0MiB  32.0MiB       extended    1.0GiB",
		"(* is --slot outboxd)",
		"note: 2 more slot(s) of other databases or physical replication not shown (billing: 1, physical: 1), retaining up to 1.0MiB of WAL",
		"inactive slots keep their WAL", "old_debezium",
		"publication outboxd (publish insert)",
		"  public.outbox   yes     no      no      no",
		`  sales."Outbox"  yes`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q", want)
		}
	}

	r = &statusReport{Database: "empty", ServerVersion: "15", CurrentWALLSN: "0/1", Slot: "outboxd", Publication: statusPublication{Name: "outboxd"}}
	b.Reset()
	writeStatus(&b, r)
	for _, want := range []string{"no replication slots in database empty", "slot outboxd does not exist", "publication outboxd does not exist"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("empty status lacks %q:\n%s", want, b.String())
		}
	}
}

func TestStatusHelp(t *testing.T) {
	code, out, _ := runCmd(t, nil, "status", "--help")
	if code != 0 || !strings.Contains(out, "Usage: outboxd status [options]") || !strings.Contains(out, "--json  [OUTBOXD_JSON]") {
		t.Errorf("exit %d\n%s", code, out)
	}
}
