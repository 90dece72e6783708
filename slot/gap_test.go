package slot

import (
	"strings"
	"testing"
)

func TestCheckGap(t *testing.T) {
	known := Progress{LSN: 0x3000100, SystemID: "7321", Timeline: 1}
	for _, c := range []struct {
		name  string
		known Progress
		found bool
		srv   server
		want  string // substring; "" = no gap
	}{
		{"fresh install: no record", Progress{}, false, server{systemID: "7321", flushed: 0x100}, ""},
		{"slot exists, server ahead", known, true, server{systemID: "7321", timeline: 2, flushed: 0x3000200}, ""},
		{"synced slot behind the record: duplicates, no gap", known, true, server{systemID: "7321", timeline: 2, flushed: 0x3000100}, ""},
		{"slot missing", known, false, server{systemID: "7321", timeline: 2, flushed: 0x9000000}, `replication slot "s" does not exist, but outboxd has confirmed it up to LSN 0/3000100 (system 7321, timeline 1)`},
		{"slot missing, exactly-once checkpoint without system id", Progress{LSN: 0x10}, false, server{systemID: "7321", flushed: 0x20}, "(system unknown, timeline 0)"},
		{"another cluster", known, true, server{systemID: "9999", flushed: 0x9000000}, "another cluster (system identifier 9999)"},
		{"server behind what was published", known, true, server{systemID: "7321", flushed: 0x3000000}, "the server's WAL ends at 0/3000000, before LSN 0/3000100"},
	} {
		got := checkGap("s", c.known, c.found, c.srv)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: gap %q, want %q", c.name, got, c.want)
		}
	}
}

func TestWantFailover(t *testing.T) {
	for _, c := range []struct {
		mode    string
		version int
		want    bool
		err     string
	}{
		{"auto", 160004, false, ""},
		{"", 170000, true, ""},
		{"auto", 180004, true, ""},
		{"false", 180004, false, ""},
		{"true", 170004, true, ""},
		{"true", 160004, false, "--slot-failover true needs PostgreSQL 17 or later (failover slots); this server is 16.4"},
	} {
		got, err := wantFailover(c.mode, c.version)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("wantFailover(%q, %d) = %v, %v; want %v, %q", c.mode, c.version, got, err, c.want, c.err)
		}
	}
}
