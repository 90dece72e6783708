package main

import (
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/internal/pprofcap"
)

// The endpoints have no authentication: the binary listens on loopback by
// default, and every connection is bounded in time.
const (
	httpReadTimeout  = 10 * time.Second
	httpWriteTimeout = pprofcap.MaxSeconds*time.Second + 10*time.Second // a whole profile
	httpIdleTimeout  = 60 * time.Second
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

// swapHandler serves whichever handler was set last: the starting one while
// outboxd waits for what it needs, then the relay's.
type swapHandler struct{ h atomic.Pointer[http.Handler] }

func (s *swapHandler) set(h http.Handler) { s.h.Store(&h) }

func (s *swapHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// startingHandler answers before the relay exists: alive (/healthz 200), not
// ready (/readyz 503 saying why), and /status as JSON saying what it waits
// for, so that scripts and tests read the state rather than the log. It
// answers only until the relay exists: the relay's handler then says what
// its own startup waits for (waiting_for_kafka once Kafka failed to answer).
func startingHandler(why string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"role": "inactive", "streaming": false, "starting": why, "waiting_for_kafka": false})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "starting: "+why, http.StatusServiceUnavailable)
	})
	return mux
}
