package pprofcap

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestSeconds(t *testing.T) {
	h := Seconds(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("served")) })
	for q, want := range map[string]int{"": 200, "?seconds=60": 200, "?seconds=0.5": 200, "?seconds=61": 400, "?seconds=0": 400, "?seconds=-1": 400, "?seconds=x": 400} {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest("GET", "/debug/pprof/profile"+q, nil))
		if rec.Code != want {
			t.Errorf("%q: %d %q, want %d", q, rec.Code, rec.Body.String(), want)
		}
	}
}
