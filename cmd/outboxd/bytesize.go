package main

import (
	"fmt"
	"strconv"
	"strings"
)

// byteSize is a flag holding a byte count written as 1048576, 64MiB, 1GiB, 512KB.
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

func (b *byteSize) String() string { return formatBytes(int64(*b)) }

func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("want a byte count such as 1048576, 64MiB or 1GiB")
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
