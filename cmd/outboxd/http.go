package main

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newHTTPHandler serves /metrics, /healthz, /readyz, /status and, when
// enabled, /debug/pprof.
func newHTTPHandler(m *metrics, st *state, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := st.ready(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(st.status())
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", capSeconds(pprof.Profile))
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", capSeconds(pprof.Trace))
	}
	return mux
}

// The endpoints have no authentication: the binary listens on loopback by
// default, and every connection is bounded in time.
const (
	httpReadTimeout  = 10 * time.Second
	httpWriteTimeout = maxPprofSeconds*time.Second + 10*time.Second // a whole profile
	httpIdleTimeout  = 60 * time.Second
	maxPprofSeconds  = 60
)

// newHTTPServer is the HTTP server with its timeouts: a client that sends
// slowly, or never reads, cannot hold connections open.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    16 << 10,
	}
}

// capSeconds refuses a profile or trace longer than maxPprofSeconds: each
// one keeps a goroutine busy (and a trace costs CPU) for its whole length.
func capSeconds(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if n, err := strconv.ParseFloat(v, 64); err != nil || n <= 0 || n > maxPprofSeconds {
				http.Error(w, "seconds must be a number in (0, "+strconv.Itoa(maxPprofSeconds)+"]", http.StatusBadRequest)
				return
			}
		}
		h(w, r)
	}
}
