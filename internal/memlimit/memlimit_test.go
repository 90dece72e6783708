package memlimit

import (
	"io/fs"
	"math"
	"testing"
)

func TestSet(t *testing.T) {
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			if s, ok := m[p]; ok {
				return []byte(s), nil
			}
			return nil, fs.ErrNotExist
		}
	}
	noEnv := func(string) string { return "" }
	gomemlimit := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "100MiB"
		}
		return ""
	}
	for _, tc := range []struct {
		name     string
		env      func(string) string
		files    map[string]string
		fallback int64
		want     Result
		applied  int64
	}{
		{"v2 limit", noEnv, map[string]string{paths[0]: "67108864\n"}, 0,
			Result{Limit: 60397977, Cgroup: 64 << 20, Source: paths[0]}, 60397977},
		{"v2 max", noEnv, map[string]string{paths[0]: "max\n", paths[1]: "67108864\n"}, 0, Result{}, -1},
		{"v1 limit", noEnv, map[string]string{paths[1]: "134217728\n"}, 0,
			Result{Limit: 120795955, Cgroup: 128 << 20, Source: paths[1]}, 120795955},
		{"v1 unlimited", noEnv, map[string]string{paths[1]: "9223372036854771712\n"}, 0, Result{}, -1},
		{"no cgroup", noEnv, nil, 0, Result{}, -1},
		{"GOMEMLIMIT wins", gomemlimit, map[string]string{paths[0]: "67108864\n"}, 0, Result{Source: "GOMEMLIMIT"}, -1},
		// The fallback: only where no limit is found.
		{"no cgroup, fallback", noEnv, nil, 32 << 20, Result{Limit: 32 << 20, Source: SourceDefault}, 32 << 20},
		{"v2 max, fallback", noEnv, map[string]string{paths[0]: "max\n"}, 40 << 20, Result{Limit: 40 << 20, Source: SourceDefault}, 40 << 20},
		{"v1 unlimited, fallback", noEnv, map[string]string{paths[1]: "9223372036854771712\n"}, 32 << 20,
			Result{Limit: 32 << 20, Source: SourceDefault}, 32 << 20},
		{"cgroup over fallback", noEnv, map[string]string{paths[0]: "67108864\n"}, 32 << 20,
			Result{Limit: 60397977, Cgroup: 64 << 20, Source: paths[0]}, 60397977},
		{"GOMEMLIMIT over fallback", gomemlimit, nil, 32 << 20, Result{Source: "GOMEMLIMIT"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			applied := int64(-1)
			got := set(tc.env, files(tc.files), func(n int64) int64 { applied = n; return 0 }, tc.fallback)
			if got != tc.want || applied != tc.applied {
				t.Fatalf("set = %+v, applied %d; want %+v, applied %d", got, applied, tc.want, tc.applied)
			}
			if got.String() == "" {
				t.Fatal("empty message")
			}
		})
	}
}

// ForInflight: twice the in-flight bytes, never below MinDefault, never
// overflowing.
func TestForInflight(t *testing.T) {
	for _, tc := range []struct{ bytes, want int64 }{
		{0, MinDefault},
		{4 << 20, MinDefault},
		{16 << 20, 32 << 20},
		{17 << 20, 34 << 20},
		{1 << 30, 2 << 30},
		{math.MaxInt64, math.MaxInt64},
	} {
		if got := ForInflight(tc.bytes); got != tc.want {
			t.Errorf("ForInflight(%d) = %d, want %d", tc.bytes, got, tc.want)
		}
	}
}
