package slot

import (
	"testing"
	"time"
)

func TestParseRow(t *testing.T) {
	b := func(s string) []byte { return []byte(s) }
	// An active outboxd slot, as the simple protocol returns it.
	s, err := parseRow([][]byte{b("outboxd"), b("logical"), b("pgoutput"), b("orders"), b("t"), b("4242"),
		b("outboxd"), nil, b("2026-12-01 11:00:00.5+00"), b("2026-12-01 11:00:07.25+00"),
		b("0/3000100"), b("0/2FFF000"), b("4096"), b("-16"), b("reserved"), nil, b("t"), b("f"), b("f"), b("1796200230.756684")})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "outboxd" || !s.Active || s.ActivePID != 4242 || s.ConfirmedFlush != 0x3000100 || s.RestartLSN != 0x2FFF000 ||
		*s.LagBytes != 4096 || *s.RetainedBytes != -16 || s.SafeWALSize != nil || !s.Failover || s.Synced ||
		s.Holder.Reply != "2026-12-01 11:00:07.25+00" || s.Holder.Silent != -1 || !s.ServerTime.Equal(time.UnixMicro(1796200230756684)) {
		t.Fatalf("%+v", s)
	}
	if h := s.Holder.String(); h != "outboxd from local socket since 2026-12-01 11:00:00.5+00" {
		t.Errorf("holder %q", h)
	}
	if s.Stale(time.Nanosecond) {
		t.Error("stale on a single look")
	}
	// A physical slot never used: NULL wherever PostgreSQL has no value.
	s, err = parseRow([][]byte{b("replica1"), b("physical"), nil, nil, b("f"), nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, b("f"), b("1796200230.756684")})
	if err != nil {
		t.Fatal(err)
	}
	if s.ActivePID != 0 || s.ConfirmedFlush != 0 || s.LagBytes != nil || s.RetainedBytes != nil || s.Holder.Silent != -1 || s.Holder.Reply != "" || s.Holder.String() != "" || s.Stale(time.Second) {
		t.Fatalf("%+v", s)
	}
	if _, err := parseRow([][]byte{b("x")}); err == nil {
		t.Error("a short row parsed")
	}
	if _, err := parseRow([][]byte{b("x"), b("logical"), nil, nil, b("f"), nil, nil, nil, nil, nil, b("zz"), nil, nil, nil, nil, nil, nil, nil, b("f"), nil}); err == nil {
		t.Error("a bad LSN parsed")
	}
}

// The holder's silence is timed on the server's clock only (issue 31 item
// 5): the reply mark is the client's send time, and a client whose clock
// runs an hour behind the server's, replying every second, is never
// silent, where now() - reply_time said an hour. A mark that stops
// changing is silent from the server time it was first seen; a new
// walsender (another PID) starts over; a role that cannot see the mark,
// and a single look, know nothing.
func TestSilenceOnTheServersClock(t *testing.T) {
	server := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	client := server.Add(-time.Hour) // the active's host: an hour behind
	look := func(w *Silence, pid int, reply string, at time.Time) Slot {
		s := Slot{Name: "s", Active: true, ActivePID: pid, ServerTime: at, Holder: Holder{Application: "outboxd", Reply: reply}}
		w.Observe(&s)
		return s
	}
	mark := func(t time.Time) string { return t.Format("2006-01-02 15:04:05.999999-07") }
	const timeout = 10 * time.Second
	var w Silence
	for i := range 30 { // 30 s of replies every second, polled every second
		s := look(&w, 42, mark(client.Add(time.Duration(i)*time.Second)), server.Add(time.Duration(i)*time.Second))
		if s.Holder.Silent != 0 || s.Stale(timeout) {
			t.Fatalf("poll %d: a client replying every second with its clock an hour behind is silent %s, stale %v", i, s.Holder.Silent, s.Stale(timeout))
		}
	}
	// It stops replying: silent from the server time its last mark was
	// first seen.
	last := mark(client.Add(29 * time.Second))
	for i, want := range []struct {
		after time.Duration
		stale bool
	}{{5 * time.Second, false}, {10 * time.Second, false}, {10*time.Second + time.Millisecond, true}} {
		s := look(&w, 42, last, server.Add(29*time.Second+want.after))
		if s.Holder.Silent != want.after || s.Stale(timeout) != want.stale {
			t.Fatalf("step %d: silent %s, stale %v; want %s, %v", i, s.Holder.Silent, s.Stale(timeout), want.after, want.stale)
		}
	}
	// Another walsender with the same mark starts over.
	if s := look(&w, 43, last, server.Add(time.Minute)); s.Holder.Silent != 0 {
		t.Fatalf("a new walsender: silent %s", s.Holder.Silent)
	}
	// Unknown: no mark (the role may not see it), or a single look.
	if s := look(&w, 43, "", server.Add(2*time.Minute)); s.Holder.Silent != -1 || s.Stale(time.Nanosecond) {
		t.Fatalf("no mark: silent %s", s.Holder.Silent)
	}
	if s := look(nil, 42, last, server.Add(time.Hour)); s.Holder.Silent != -1 || s.Stale(time.Nanosecond) {
		t.Fatalf("a single look: silent %s", s.Holder.Silent)
	}
}
