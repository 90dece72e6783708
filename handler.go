package outboxd

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"

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
		ok, why := st.ready()
		switch {
		case !ok:
			http.Error(w, why, http.StatusServiceUnavailable)
		case strings.HasPrefix(why, roleStandby):
			w.Write([]byte(why + "\n")) // ready to take over
		default:
			w.Write([]byte("ok\n"))
		}
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

// MaxPprofSeconds caps a CPU profile or trace: an unbounded one would hold a
// connection and a core for as long as the caller asks.
const MaxPprofSeconds = 60

func capSeconds(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if n, err := strconv.ParseFloat(v, 64); err != nil || n <= 0 || n > MaxPprofSeconds {
				http.Error(w, "seconds must be a number in (0, "+strconv.Itoa(MaxPprofSeconds)+"]", http.StatusBadRequest)
				return
			}
		}
		h(w, r)
	}
}
