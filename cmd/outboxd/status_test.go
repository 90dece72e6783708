package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/slot"
)

func ptr[T any](v T) *T { return &v }

func TestWriteStatus(t *testing.T) {
	r := &slot.Status{
		Database: "orders", ServerVersion: "16.4", CurrentWALLSN: "0/3000000", Slot: "outboxd", SlotFound: true,
		Slots: []slot.Listed{
			{Slot: slot.Slot{Name: "outboxd", Type: "logical", Plugin: "pgoutput", Database: "orders", Active: true, ActivePID: 4242,
				Holder: slot.Holder{Application: "outboxd", Client: "10.0.0.7"}, ConfirmedFlush: 0x2FFF000, RestartLSN: 0x2000000,
				LagBytes: ptr(int64(4096)), RetainedBytes: ptr(int64(16 << 20)), WALStatus: "reserved"}, Selected: true},
			{Slot: slot.Slot{Name: "old_debezium", Type: "logical", Plugin: "decoderbufs", Database: "orders", ConfirmedFlush: 0x1000000,
				RestartLSN: 0x1000000, LagBytes: ptr(int64(32 << 20)), RetainedBytes: ptr(int64(32 << 20)), WALStatus: "extended",
				SafeWALSize: ptr(int64(1 << 30))}},
		},
		OtherSlots: []slot.Listed{{Slot: slot.Slot{Name: "replica1", Type: "physical", RetainedBytes: ptr(int64(1 << 20))}},
			{Slot: slot.Slot{Name: "x", Type: "logical", Database: "billing"}}},
		Publication: slot.PublicationStatus{Name: "outboxd", Exists: true, Insert: true, Tables: []string{"public.outbox", `sales."Outbox"`}},
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

	r = &slot.Status{Database: "empty", ServerVersion: "15", CurrentWALLSN: "0/1", Slot: "outboxd", Publication: slot.PublicationStatus{Name: "outboxd"}}
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

// The JSON of a slot keeps pg_replication_slots' names, LSNs as text and
// null where PostgreSQL has no value.
func TestStatusSlotJSON(t *testing.T) {
	for _, c := range []struct {
		s    slot.Listed
		want string
	}{
		{slot.Listed{Slot: slot.Slot{Name: "outboxd", Type: "logical", Plugin: "pgoutput", Database: "orders", Active: true, ActivePID: 4242,
			Holder: slot.Holder{Application: "outboxd", Client: "10.0.0.7"}, ConfirmedFlush: 0x2FFF000, RestartLSN: 0x2000000,
			LagBytes: ptr(int64(4096)), RetainedBytes: ptr(int64(-1)), WALStatus: "reserved", SafeWALSize: ptr(int64(0)), Failover: true}, Selected: true},
			`{"slot_name":"outboxd","slot_type":"logical","plugin":"pgoutput","database":"orders","active":true,"active_pid":4242,` +
				`"application_name":"outboxd","client_addr":"10.0.0.7","confirmed_flush_lsn":"0/2FFF000","restart_lsn":"0/2000000",` +
				`"lag_bytes":4096,"retained_wal_bytes":-1,"wal_status":"reserved","safe_wal_size_bytes":0,"failover":true,"synced":false,"selected":true}`},
		{slot.Listed{Slot: slot.Slot{Name: "replica1", Type: "physical"}},
			`{"slot_name":"replica1","slot_type":"physical","plugin":"","database":"","active":false,"active_pid":null,` +
				`"application_name":"","client_addr":"","confirmed_flush_lsn":null,"restart_lsn":null,` +
				`"lag_bytes":null,"retained_wal_bytes":null,"wal_status":"","safe_wal_size_bytes":null,"failover":false,"synced":false,"selected":false}`},
	} {
		b, err := json.Marshal(c.s)
		if err != nil || string(b) != c.want {
			t.Errorf("JSON of %s:\n got %s (%v)\nwant %s", c.s.Name, b, err, c.want)
		}
	}
}
