package harness

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Metrics keys each sample by its series as exposed, labels and all, and
// passes over comments.
func TestMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `# HELP outboxd_blocked 1 while outboxd holds.
# TYPE outboxd_blocked gauge
outboxd_blocked 1
outboxd_events_skipped_total{reason="replayed"} 3
outboxd_errors_total{error="a b c"} 2.5
go_memstats_sys_bytes 1.2345e+07
`)
	}))
	defer srv.Close()
	got, err := Metrics(context.Background(), strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"outboxd_blocked": 1,
		`outboxd_events_skipped_total{reason="replayed"}`: 3,
		`outboxd_errors_total{error="a b c"}`:             2.5,
		"go_memstats_sys_bytes":                           12345000,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("Metrics read %v, want %v", got, want)
	}
}
