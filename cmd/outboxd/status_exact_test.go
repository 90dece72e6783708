package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/outboxd/outboxd/slot"
)

var updateStatus = flag.Bool("update-status", false, "rewrite testdata/status/*.txt from writeStatus")

// statusFixtures cover every branch of writeStatus: a standby, a lost and
// an idle slot, --slot in another database or missing, more than six other
// databases, a publication without INSERT, FOR ALL TABLES, with no tables
// or missing.
func statusFixtures() map[string]*slot.Status {
	lsn := func(name, db string, active bool, wal string) slot.Listed {
		return slot.Listed{Slot: slot.Slot{Name: name, Type: "logical", Plugin: "pgoutput", Database: db, Active: active, ActivePID: 7,
			ConfirmedFlush: 0x1000, RetainedBytes: ptr(int64(3 << 20)), LagBytes: ptr(int64(0)), WALStatus: wal, Failover: true, Synced: active}}
	}
	var many []slot.Listed
	for _, db := range []string{"a", "b", "c", "d", "e", "f", "g", "a", ""} {
		many = append(many, lsn("s_"+db, db, false, "reserved"))
	}
	other := lsn("outboxd", "billing", false, "reserved")
	other.Selected = true
	return map[string]*slot.Status{
		"standby": {Database: "orders", ServerVersion: "17.2 (Debian 17.2-1)", CurrentWALLSN: "0/5000000", InRecovery: true, Slot: "outboxd", SlotFound: true,
			Slots:       []slot.Listed{lsn("outboxd", "orders", true, "reserved"), lsn("gone", "orders", false, "lost"), lsn("idle", "orders", false, "extended")},
			OtherSlots:  many,
			Publication: slot.PublicationStatus{Name: "outboxd", Exists: true, Update: true, AllTables: true, Tables: []string{"public.outbox"}}},
		"other database": {Database: "orders", ServerVersion: "16", CurrentWALLSN: "0/1", Slot: "outboxd", SlotFound: true, OtherSlots: []slot.Listed{other},
			Publication: slot.PublicationStatus{Name: "Out Box", Exists: true, Insert: true}},
		"missing": {Database: "orders", ServerVersion: "15", CurrentWALLSN: "0/1", Slot: "outboxd",
			Slots:       []slot.Listed{lsn("x", "orders", true, "")},
			Publication: slot.PublicationStatus{Name: "outboxd"}},
	}
}

// writeStatus's whole text, byte for byte, for each fixture.
func TestWriteStatusExact(t *testing.T) {
	for name, r := range statusFixtures() {
		var b bytes.Buffer
		writeStatus(&b, r)
		path := filepath.Join("testdata", "status", name+".txt")
		if *updateStatus {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if b.String() != string(want) {
			t.Errorf("%s:\n got:\n%s\nwant:\n%s", name, b.String(), want)
		}
	}
}
