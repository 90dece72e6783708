// Package memlimit sets the Go runtime's soft memory limit: from the
// container's cgroup memory limit, or, without one, from the in-flight bound.
//
// A Go process does not know it runs in a container: without GOMEMLIMIT its
// heap may grow to twice the live heap (GOGC=100) before a collection, so a
// burst of in-flight events that fits the cgroup limit as live data can
// still get the process OOM-killed. With a soft limit near the cgroup's,
// the collector runs harder as the heap approaches it instead.
//
// Without a cgroup limit the same growth is what made a 200,000-row
// transaction peak at two to three times the in-flight bound's bytes
// (issue 34): the live heap at a full window is the in-flight records, and
// GOGC=100 lets the heap reach twice that, plus the garbage of a stream that
// never pauses. ForInflight caps it where the in-flight records fit.
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

// MinDefault is the smallest soft limit ForInflight returns: the Go
// memory of an idle relay (about 8 MiB) with room for a full window of small
// events, whose fixed per-event cost (structs, headers, the client's copy)
// outweighs their accounted bytes. With the ~27 MiB of the binary's pages
// that RSS also counts, it keeps the default settings within 64 MiB.
const MinDefault = 32 << 20

// ForInflight is the soft limit outboxd sets when neither GOMEMLIMIT nor a
// cgroup limit is found: twice --max-inflight-bytes (once for the records'
// bytes, once for what they cost beyond them and for the heap's growth
// between collections), at least MinDefault. A larger bound raises it, so
// that the collector never has to run without pause to keep a full window
// under it (the runtime caps that at half the CPU).
func ForInflight(inflightBytes int64) int64 {
	if inflightBytes > math.MaxInt64/4 {
		return math.MaxInt64
	}
	return max(MinDefault, 2*inflightBytes)
}

// Paths of the cgroup memory limit files: v2 first, then v1.
var paths = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// Result says what Set did.
type Result struct {
	Limit  int64  // the soft limit set, bytes (0: none set)
	Cgroup int64  // the cgroup limit it was derived from (0: none found)
	Source string // the file the cgroup limit came from, "GOMEMLIMIT", or SourceDefault
}

// SourceDefault is Result.Source when the limit is Set's fallback.
const SourceDefault = "default"

// String is the log line's message.
func (r Result) String() string {
	switch {
	case r.Source == "GOMEMLIMIT":
		return "GOMEMLIMIT is set: the Go runtime's memory limit is left as it is"
	case r.Source == SourceDefault:
		return fmt.Sprintf("no cgroup memory limit found: Go memory limit set to %d MiB (twice --max-inflight-bytes, at least %d MiB); set GOMEMLIMIT to override",
			r.Limit>>20, MinDefault>>20)
	case r.Limit > 0:
		return fmt.Sprintf("Go memory limit set to %d MiB (%.0f%% of the cgroup limit of %d MiB in %s); set GOMEMLIMIT to override",
			r.Limit>>20, Fraction*100, r.Cgroup>>20, r.Source)
	}
	return "no cgroup memory limit found: the Go runtime's memory limit is unset"
}

// Set sets debug.SetMemoryLimit to Fraction of the cgroup memory limit,
// unless GOMEMLIMIT is set (then the runtime has already applied it). When
// no limit is found ("max", an unreadable file, or v1's "unlimited" value,
// which is close to math.MaxInt64) it sets fallback instead (none if
// fallback is 0).
func Set(getenv func(string) string, fallback int64) Result {
	return set(getenv, os.ReadFile, debug.SetMemoryLimit, fallback)
}

func set(getenv func(string) string, read func(string) ([]byte, error), apply func(int64) int64, fallback int64) Result {
	if getenv("GOMEMLIMIT") != "" {
		return Result{Source: "GOMEMLIMIT"}
	}
	if n, p := cgroupLimit(read); n > 0 {
		limit := int64(float64(n) * Fraction)
		apply(limit)
		return Result{Limit: limit, Cgroup: n, Source: p}
	}
	if fallback > 0 {
		apply(fallback)
		return Result{Limit: fallback, Source: SourceDefault}
	}
	return Result{}
}

// cgroupLimit is the container's memory limit and the file it came from;
// 0 if there is none.
func cgroupLimit(read func(string) ([]byte, error)) (int64, string) {
	for _, p := range paths {
		b, err := read(p)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		// "max" (v2) fails to parse; v1 reports no limit as a huge number
		// rounded to the page size.
		if err != nil || n <= 0 || n >= math.MaxInt64/2 {
			return 0, ""
		}
		return n, p
	}
	return 0, ""
}
