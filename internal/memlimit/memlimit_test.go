package memlimit

import (
	"io/fs"
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
	for _, tc := range []struct {
		name    string
		env     func(string) string
		files   map[string]string
		want    Result
		applied int64
	}{
		{"v2 limit", noEnv, map[string]string{paths[0]: "67108864\n"},
			Result{Limit: 60397977, Cgroup: 64 << 20, Source: paths[0]}, 60397977},
		{"v2 max", noEnv, map[string]string{paths[0]: "max\n", paths[1]: "67108864\n"}, Result{}, -1},
		{"v1 limit", noEnv, map[string]string{paths[1]: "134217728\n"},
			Result{Limit: 120795955, Cgroup: 128 << 20, Source: paths[1]}, 120795955},
		{"v1 unlimited", noEnv, map[string]string{paths[1]: "9223372036854771712\n"}, Result{}, -1},
		{"no cgroup", noEnv, nil, Result{}, -1},
		{"GOMEMLIMIT wins", func(k string) string {
			if k == "GOMEMLIMIT" {
				return "100MiB"
			}
			return ""
		}, map[string]string{paths[0]: "67108864\n"}, Result{Source: "GOMEMLIMIT"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			applied := int64(-1)
			got := set(tc.env, files(tc.files), func(n int64) int64 { applied = n; return 0 })
			if got != tc.want || applied != tc.applied {
				t.Fatalf("set = %+v, applied %d; want %+v, applied %d", got, applied, tc.want, tc.applied)
			}
			if got.String() == "" {
				t.Fatal("empty message")
			}
		})
	}
}
