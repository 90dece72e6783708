package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/test/bench"
)

// The sustained case's flags (test/bench/sustained.go). Zero keeps the
// case's default: 10 minutes per transaction size at 20,000 ev/s, 1 and 10
// ev/txn (-quick: 20 s).
var (
	sustainedDuration = flag.Duration("sustained-duration", 0, "sustained case: the measured window per transaction size (default 10m; -quick 20s)")
	sustainedRate     = flag.Int("sustained-rate", 0, "sustained case: target events/s (default 20000); writers that cannot hold it run at 95% of what a probe at it reached")
	sustainedTxnSizes = flag.String("sustained-txn-sizes", "", "sustained case: comma-separated events per transaction, one run each (default 1,10)")
	sustainedProbe    = flag.Duration("sustained-probe", 0, "sustained case: how long the writers try the target rate before the window (default 15s; -quick 3s)")
)

func applySustained(cfg *bench.Config) {
	s := &cfg.Sustained
	if *sustainedDuration > 0 {
		s.Duration = *sustainedDuration
	}
	if *sustainedRate > 0 {
		s.Rate = *sustainedRate
	}
	if *sustainedProbe > 0 {
		s.Probe = *sustainedProbe
	}
	if *sustainedTxnSizes != "" {
		s.TxnSizes = nil
		for _, f := range strings.Split(*sustainedTxnSizes, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || k <= 0 {
				fmt.Fprintf(os.Stderr, "bench: -sustained-txn-sizes: %q is not a positive number of events per transaction\n", f)
				os.Exit(2)
			}
			s.TxnSizes = append(s.TxnSizes, k)
		}
	}
}
