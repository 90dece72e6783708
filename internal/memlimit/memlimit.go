// Package memlimit sets the Go runtime's soft memory limit from the
// container's cgroup memory limit.
//
// A Go process does not know it runs in a container: without GOMEMLIMIT its
// heap may grow to twice the live heap (GOGC=100) before a collection, so a
// burst of in-flight events that fits the cgroup limit as live data can
// still get the process OOM-killed. With a soft limit near the cgroup's,
// the collector runs harder as the heap approaches it instead.
package memlimit

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Fraction of the cgroup limit given to the Go runtime: the rest is for
// what the runtime does not count (thread stacks of cgo calls, the binary's
// text, page cache charged to the cgroup).
const Fraction = 0.9

// Paths of the cgroup memory limit files: v2 first, then v1.
var paths = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// Result says what Set did.
type Result struct {
	Limit  int64  // the soft limit set, bytes (0: none set)
	Cgroup int64  // the cgroup limit it was derived from (0: none found)
	Source string // the file the cgroup limit came from, or "GOMEMLIMIT"
}

// String is the log line's message.
func (r Result) String() string {
	switch {
	case r.Source == "GOMEMLIMIT":
		return "GOMEMLIMIT is set: the Go runtime's memory limit is left as it is"
	case r.Limit > 0:
		return fmt.Sprintf("Go memory limit set to %d MiB (%.0f%% of the cgroup limit of %d MiB in %s); set GOMEMLIMIT to override",
			r.Limit>>20, Fraction*100, r.Cgroup>>20, r.Source)
	}
	return "no cgroup memory limit found: the Go runtime's memory limit is unset"
}

// Set sets debug.SetMemoryLimit to Fraction of the cgroup memory limit,
// unless GOMEMLIMIT is set (then the runtime has already applied it) or no
// limit is found ("max", an unreadable file, or v1's "unlimited" value,
// which is close to math.MaxInt64).
func Set(getenv func(string) string) Result {
	return set(getenv, os.ReadFile, debug.SetMemoryLimit)
}

func set(getenv func(string) string, read func(string) ([]byte, error), apply func(int64) int64) Result {
	if getenv("GOMEMLIMIT") != "" {
		return Result{Source: "GOMEMLIMIT"}
	}
	for _, p := range paths {
		b, err := read(p)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		// "max" (v2) fails to parse; v1 reports no limit as a huge number
		// rounded to the page size.
		if err != nil || n <= 0 || n >= math.MaxInt64/2 {
			return Result{}
		}
		limit := int64(float64(n) * Fraction)
		apply(limit)
		return Result{Limit: limit, Cgroup: n, Source: p}
	}
	return Result{}
}
