package outboxd

import (
	"net/http/httptest"
	"testing"
	"time"
)

// Insecure settings found at startup are on /status.
func TestStatusShowsSecurityWarnings(t *testing.T) {
	st := &state{warnings: []string{"sslmode is prefer"}}
	if got, _ := st.status()["security_warnings"].([]string); len(got) != 1 {
		t.Fatalf("/status security_warnings %v", st.status()["security_warnings"])
	}
}

// pprof profiles and traces are bounded.
func TestPprofDurationsCapped(t *testing.T) {
	st := &state{}
	h := newHTTPHandler(newMetrics("test", st), st, true)
	for q, want := range map[string]int{"seconds=3600": 400, "seconds=-1": 400, "seconds=abc": 400} {
		for _, path := range []string{"/debug/pprof/profile", "/debug/pprof/trace"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", path+"?"+q, nil))
			if rec.Code != want {
				t.Errorf("%s?%s: %d, want %d", path, q, rec.Code, want)
			}
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/trace?seconds=0.01", nil))
	if rec.Code != 200 {
		t.Errorf("a short trace: %d", rec.Code)
	}
}

// Item 2: logical messages are requested only when something consumes them.
func TestMessagesOnlyWhenNeeded(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want bool
	}{
		{Config{}, false},
		{Config{HeartbeatInterval: time.Second}, true},
		{Config{MessagePrefix: "outbox"}, true},
	} {
		if got := tc.cfg.wantMessages(); got != tc.want {
			t.Errorf("%+v: wantMessages %v", tc.cfg, got)
		}
	}
}
