package main

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newHTTPHandler serves /metrics, /healthz, /readyz and /status.
func newHTTPHandler(m *metrics, st *state) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st.mu.Lock()
		ok := st.streaming
		st.mu.Unlock()
		if !ok {
			http.Error(w, "not streaming from the replication slot", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		st.mu.Lock()
		out := map[string]any{"streaming": st.streaming, "slot": st.slotInfo.Name, "last_error": st.lastErr}
		if st.wm != nil {
			s := st.wm.Stats()
			out["confirmed_lsn"] = s.Confirmed.String()
			out["inflight_events"] = s.InflightEvents
		}
		st.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	})
	return mux
}
