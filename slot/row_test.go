package slot

import (
	"testing"
	"time"
)

func TestParseRow(t *testing.T) {
	b := func(s string) []byte { return []byte(s) }
	// An active outboxd slot, as the simple protocol returns it.
	s, err := parseRow([][]byte{b("outboxd"), b("logical"), b("pgoutput"), b("orders"), b("t"), b("4242"),
		b("outboxd"), nil, b("2026-12-01 11:00:00.5+00"), b("42.500000"),
		b("0/3000100"), b("0/2FFF000"), b("4096"), b("-16"), b("reserved"), nil, b("t"), b("f"), b("f")})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "outboxd" || !s.Active || s.ActivePID != 4242 || s.ConfirmedFlush != 0x3000100 || s.RestartLSN != 0x2FFF000 ||
		*s.LagBytes != 4096 || *s.RetainedBytes != -16 || s.SafeWALSize != nil || !s.Failover || s.Synced || s.Holder.Silent != 42500*time.Millisecond {
		t.Fatalf("%+v", s)
	}
	if h := s.Holder.String(); h != "outboxd from local socket since 2026-12-01 11:00:00.5+00" {
		t.Errorf("holder %q", h)
	}
	if !s.Stale(42*time.Second) || s.Stale(43*time.Second) || s.Stale(0) {
		t.Error("stale")
	}
	// A physical slot never used: NULL wherever PostgreSQL has no value.
	s, err = parseRow([][]byte{b("replica1"), b("physical"), nil, nil, b("f"), nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, b("f")})
	if err != nil {
		t.Fatal(err)
	}
	if s.ActivePID != 0 || s.ConfirmedFlush != 0 || s.LagBytes != nil || s.RetainedBytes != nil || s.Holder.Silent != -1 || s.Holder.String() != "" || s.Stale(time.Second) {
		t.Fatalf("%+v", s)
	}
	if _, err := parseRow([][]byte{b("x")}); err == nil {
		t.Error("a short row parsed")
	}
	if _, err := parseRow([][]byte{b("x"), b("logical"), nil, nil, b("f"), nil, nil, nil, nil, nil, b("zz"), nil, nil, nil, nil, nil, nil, nil, b("f")}); err == nil {
		t.Error("a bad LSN parsed")
	}
}
