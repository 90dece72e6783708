// Package humanize formats quantities for people (logs, /readyz, outboxd status).
package humanize

import "strconv"

// Bytes formats a byte count for people: 1.5GiB rather than an exact
// count. Logs, /readyz and outboxd status use it.
func Bytes(n int64) string {
	neg := n < 0
	if neg {
		n = -n
	}
	s := strconv.FormatInt(n, 10) + "B"
	for _, u := range [...]struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult {
			s = strconv.FormatFloat(float64(n)/float64(u.mult), 'f', 1, 64) + u.suffix
			break
		}
	}
	if neg {
		return "-" + s
	}
	return s
}
