// Package pprofcap bounds the profiles /debug/pprof serves.
package pprofcap

import (
	"net/http"
	"strconv"
)

// MaxSeconds caps a CPU profile or trace: an unbounded one would hold a
// connection and a core for as long as the caller asks. The HTTP server's
// write timeout must outlast it.
const MaxSeconds = 60

// Seconds refuses a ?seconds= above MaxSeconds (or not a positive number)
// with 400, and serves h otherwise.
func Seconds(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if n, err := strconv.ParseFloat(v, 64); err != nil || n <= 0 || n > MaxSeconds {
				http.Error(w, "seconds must be a number in (0, "+strconv.Itoa(MaxSeconds)+"]", http.StatusBadRequest)
				return
			}
		}
		h(w, r)
	}
}
