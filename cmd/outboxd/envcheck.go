package main

import (
	"flag"
	"fmt"
	"strings"
)

// harnessEnv are the prefixes of OUTBOXD_* variables that the repository's
// tests, benchmarks and harness read, not outboxd: they are set in the
// environment outboxd runs in under test and are not misspelt options.
var harnessEnv = []string{"OUTBOXD_TEST_", "OUTBOXD_BENCH_", "OUTBOXD_FAULT_", "OUTBOXD_HARNESS_", "OUTBOXD_SKIP_", "OUTBOXD_KAFKA_CACHE"}

// unknownEnv returns one warning for every OUTBOXD_* variable of environ
// (os.Environ's form) that is no option of this command, naming the
// closest option's variable: a misspelt variable is otherwise ignored in
// silence and its option keeps its default.
func (o *optionSet) unknownEnv(environ []string) []string {
	known := map[string]bool{}
	var names []string
	o.fs.VisitAll(func(f *flag.Flag) {
		known[envName(f.Name)] = true
		names = append(names, envName(f.Name))
	})
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "OUTBOXD_") || known[name] || hasAnyPrefix(name, harnessEnv) {
			continue
		}
		w := fmt.Sprintf("%s is no option of %s and is ignored", name, o.fs.Name())
		if c := closest(name, names); c != "" {
			w += ": did you mean " + c + "?"
		}
		out = append(out, w)
	}
	return out
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// closest is the candidate with the fewest edits from s ("" if none is
// within a third of s's length: no suggestion beats a wild one).
func closest(s string, candidates []string) string {
	best, bestD := "", len(s)/3+1
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes: the
// names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
