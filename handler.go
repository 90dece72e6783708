package outboxd

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outboxd/internal/pprofcap"
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
		case strings.HasPrefix(why, string(roleStandby)):
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
		mux.HandleFunc("/debug/pprof/profile", pprofcap.Seconds(pprof.Profile))
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprofcap.Seconds(pprof.Trace))
	}
	return mux
}
