package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteSize is a flag holding a byte count written as 1048576, 64MiB, 1GiB or
// 512kB. Units are matched without regard to case, so PostgreSQL's "kB" and
// Kafka's "KB" mean the same: the SI units (kB, MB, GB, TB) are powers of
// 1000 and the IEC units (KiB, MiB, GiB, TiB) powers of 1024, whichever way
// they are capitalised. Negative counts and counts that overflow are refused.
type byteSize int64

// byteUnits, longest suffix first within each family so that "MiB" is not
// read as "B" after an "Mi" number. The first four are also formatBytes's.
var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"kB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

const byteSizeHelp = "want a byte count such as 1048576, 512kB (×1000), 64MiB or 1GiB (×1024)"

func (b *byteSize) String() string { return formatBytes(int64(*b)) }

func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	mult := int64(1)
	lower := strings.ToLower(s)
	for _, u := range byteUnits {
		if strings.HasSuffix(lower, strings.ToLower(u.suffix)) {
			s, mult = strings.TrimSpace(s[:len(s)-len(u.suffix)]), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		return fmt.Errorf("%s", byteSizeHelp)
	case n < 0:
		return fmt.Errorf("must not be negative (%s)", byteSizeHelp)
	case n > math.MaxInt64/mult:
		return fmt.Errorf("too large (%s)", byteSizeHelp)
	}
	*b = byteSize(n * mult)
	return nil
}

// formatBytes prints n in the largest binary unit that divides it, or with
// one decimal for human tables.
func formatBytes(n int64) string {
	for i := 3; i >= 0; i-- {
		u := byteUnits[i]
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
