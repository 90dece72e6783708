package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// Each finding is logged once at WARN and listed on /status in the order
// found; other paths, and /status without findings, pass unchanged.
func TestDurabilityWarnings(t *testing.T) {
	var logs bytes.Buffer
	d := &durabilityWarnings{log: slog.New(slog.NewTextHandler(&logs, nil))}
	inner := http.NewServeMux()
	inner.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"role":"active","streaming":true}` + "\n"))
	})
	inner.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	})
	h := d.handler(inner)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/status"); code != 200 || body != `{"role":"active","streaming":true}`+"\n" {
		t.Fatalf("/status without findings: %d %q", code, body)
	}
	d.add("stream a", "one replica")
	d.add("queue q", "classic")
	d.add("stream a", "one replica")
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 || !strings.Contains(logs.String(), `msg="the broker can lose events it acknowledged: one replica" destination="stream a"`) {
		t.Fatalf("log:\n%s", logs.String())
	}
	code, body := get("/status")
	var doc map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil || code != 200 {
		t.Fatalf("/status: %d %q: %v", code, body, err)
	}
	want := map[string]any{"role": "active", "streaming": true, "durability_warnings": []any{"stream a: one replica", "queue q: classic"}}
	if !reflect.DeepEqual(doc, want) {
		t.Fatalf("/status: %v, want %v", doc, want)
	}
	if code, body := get("/readyz"); code != 503 || body != "not ready\n" {
		t.Fatalf("/readyz: %d %q", code, body)
	}
}
