// Command bench is `make bench`: outboxd's throughput, latency and resource
// use, each beside what bounds it (a read-only pgoutput reader) and what it
// replaces (a polling publisher), and the cost of --exactly-once beside
// at-least-once, measured in one run on one throwaway PostgreSQL cluster,
// once per broker (kfake, one Apache Kafka node, a 3-node Apache cluster
// with RF 3 and min.insync.replicas 2), printed as one table with a broker
// column.
//
//	go run ./test/cmd/bench                  # full run, all three brokers: ~18 minutes on 2 busy cores
//	go run ./test/cmd/bench -brokers apache  # one column (kfake and apache ~5.5, apache-cluster ~7 minutes there)
//	go run ./test/cmd/bench -quick           # smoke test: 10k events per case, 5 s latency runs (~4 minutes for all three)
//	go run ./test/cmd/bench -cases debezium -quick   # beside Debezium only, on one Apache node: 10k events at 10 ev/txn, 1,000 ev/s, 10 MB idle WAL
//	go run ./test/cmd/bench -cases eos       # exactly-once vs at-least-once only: drains at 10 and 100 ev/txn, latency at 1,000 ev/s
//	go run ./test/cmd/bench -cases tracing -brokers kfake -results results   # outboxd's own spans on vs off at 5k ev/s (~3 minutes)
//	go run ./test/cmd/bench -cases schema -brokers kfake -no-polling   # one backlog plain vs an Avro and a JSON Schema pinned (~30 s on kfake)
//	go run ./test/cmd/bench -cases drain -outboxd-args '--kafka-linger 5ms'
//	go run ./test/cmd/bench -cases latency -outboxd-env 'GOMAXPROCS=1'
//	go run ./test/cmd/bench -cases drain -perf-dir /tmp/perf   # perf record outboxd + walsender
//	go run ./test/cmd/bench -cases drain -hogs 2   # beside two CPU hogs (stress-ng --cpu 2) for the whole run
//	go run ./test/cmd/bench -brokers nats,rabbitmq -cases drain,latency   # outboxd --broker nats:// and amqp:// (not in the default list)
//	go run ./test/cmd/bench -cases sustained -brokers apache-cluster -results results   # 10 min at 20k ev/s per txn size (~25 min)
//
// Progress goes to stderr, the table to stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/outboxd/outboxd/results"
	"github.com/outboxd/outboxd/test/bench"
	"github.com/outboxd/outboxd/test/harness"
)

func main() {
	var (
		quick       = flag.Bool("quick", false, "smoke-test sizes: 10k events per case, 5 s latency runs")
		outboxdArgs = flag.String("outboxd-args", "", "extra arguments for outboxd run, space-separated (e.g. '--kafka-linger 5ms')")
		outboxdEnv  = flag.String("outboxd-env", "", "extra environment for outboxd, space-separated KEY=VALUE (e.g. 'GOMAXPROCS=1 GOGC=200')")
		cases       = flag.String("cases", "drain,latency,resources,eos,debezium,binary,sched,cloudevents,schema,memory", "comma-separated cases to run: drain, latency, resources, eos (exactly-once beside at-least-once), debezium (beside Debezium + Kafka Connect on Apache Kafka), binary (the drains also with --pgoutput-binary off, interleaved), sched (the drains also with --sched-batch=false, the default CPU scheduling policy, interleaved), cloudevents (the drains also with --envelope cloudevents, binary and structured mode, interleaved), schema (one 10 ev/txn backlog drained plain, with an Avro and with a JSON Schema pinned in a registry the bench serves, interleaved), memory (one 200k-row transaction at the default in-flight bounds and smaller --max-inflight-bytes); not by default: tracing (outboxd's CPU per event and p99 at 5k ev/s with every event an OTLP span vs tracing off, first broker only), sustained (10 min per transaction size at 20k ev/s, 1 and 10 ev/txn; -sustained-* flags), dbzserver (Debezium Server 3.6 beside outboxd in the NATS and RabbitMQ drain cases: .ci/debezium-server.sh, Temurin 25)")
		perfDir     = flag.String("perf-dir", "", "record perf record -g profiles of outboxd and its walsender during each drain into this directory")
		hogs        = flag.Int("hogs", 0, "run `N` CPU hogs (stress-ng --cpu N) beside the whole run: their CPU is the split's \"hogs\", not \"others\", and the outboxd ÷ walsender targets are judged beside them (issue 34: quiet and beside 2)")
		noPolling   = flag.Bool("no-polling", false, "skip the polling publisher in the drain cases")
		timeout     = flag.Duration("timeout", 45*time.Minute, "give up after this long")
		allowMiss   = flag.Bool("allow-miss", false, "exit 0 even when a measurement misses its target")
		resultsDir  = flag.String("results", "", "also write the run as a results file (bench-<date>-<time>.json) into this directory, the one source README quotes (make bench: results/)")
		brokers     = flag.String("brokers", strings.Join(bench.DefaultBrokers(), ","), "comma-separated broker columns, run in this order: "+strings.Join(bench.AllBrokers, ", ")+" (or external, with "+harness.EnvKafka+"), and not by default "+strings.Join(bench.OtherBrokers, ", ")+" (outboxd --broker nats:// and amqp://: drain, latency, resources, memory; no exactly-once, no polling baseline)")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: go run ./test/cmd/bench [flags]   (make bench BENCH_ARGS='...')

Runs every case on each broker of -brokers in turn and prints one table with a kafka column
(-brokers nats,rabbitmq: outboxd --broker nats:// and amqp://, not in the default list).
All three columns took ~18 min on a busy 2-core machine (kfake ~5.5, apache ~5.5,
apache-cluster ~7 min); -quick took ~4 min. Exits 1 when a measurement misses its target.

`)
		flag.PrintDefaults()
	}
	flag.Parse()
	cfg := bench.DefaultConfig(*quick)
	applySustained(&cfg)
	cfg.OutboxdArgs = strings.Fields(*outboxdArgs)
	cfg.OutboxdEnv = strings.Fields(*outboxdEnv)
	for _, kv := range cfg.OutboxdEnv {
		if !strings.Contains(kv, "=") {
			fmt.Fprintf(os.Stderr, "bench: -outboxd-env: %q is not KEY=VALUE\n", kv)
			os.Exit(2)
		}
	}
	cfg.Cases = map[string]bool{}
	for _, c := range strings.Split(*cases, ",") {
		switch c = strings.TrimSpace(c); c {
		case "drain", "latency", "resources", "eos", "debezium", "binary", "sched", "cloudevents", "schema", "memory", "tracing", "sustained", "dbzserver":
			cfg.Cases[c] = true
		case "":
		default:
			fmt.Fprintf(os.Stderr, "bench: unknown case %q (drain, latency, resources, eos, debezium, binary, sched, cloudevents, schema, memory, tracing, sustained, dbzserver)\n", c)
			os.Exit(2)
		}
	}
	cfg.Brokers = nil
	for _, b := range strings.Split(*brokers, ",") {
		switch b = strings.TrimSpace(b); b {
		case harness.KindKfake, harness.KindApache, harness.KindApacheCluster, harness.KindExternal, bench.KindNATS, bench.KindRabbitMQ:
			if b == harness.KindExternal && os.Getenv(harness.EnvKafka) == "" {
				fmt.Fprintf(os.Stderr, "bench: -brokers external needs %s (comma-separated brokers)\n", harness.EnvKafka)
				os.Exit(2)
			}
			cfg.Brokers = append(cfg.Brokers, b)
		case "":
		default:
			fmt.Fprintf(os.Stderr, "bench: unknown broker %q (%s, or external)\n", b, strings.Join(append(append([]string(nil), bench.AllBrokers...), bench.OtherBrokers...), ", "))
			os.Exit(2)
		}
	}
	if len(cfg.Brokers) == 0 {
		fmt.Fprintln(os.Stderr, "bench: -brokers: no broker given")
		os.Exit(2)
	}
	cfg.PerfDir = *perfDir
	if *hogs < 0 {
		fmt.Fprintf(os.Stderr, "bench: -hogs %d: want 0 or more\n", *hogs)
		os.Exit(2)
	}
	cfg.Hogs, cfg.HogsLimit = *hogs, *timeout
	cfg.SkipPolling = *noPolling
	cfg.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Println()
	missed := res.Table(os.Stdout)
	if *resultsDir != "" {
		if p, err := results.Write(*resultsDir, res.ResultsFile(strings.Join(os.Args[1:], " "))); err != nil {
			fmt.Fprintln(os.Stderr, "bench: results file:", err)
		} else {
			fmt.Fprintln(os.Stderr, "bench: wrote", p)
		}
	}
	if res.Failed() {
		fmt.Fprintln(os.Stderr, "bench: some cases failed to run (see ERROR rows)")
		os.Exit(1)
	}
	if len(missed) > 0 && !*allowMiss {
		fmt.Fprintf(os.Stderr, "bench: %d measurement(s) missed their target: %s (-allow-miss to exit 0 anyway)\n", len(missed), strings.Join(missed, "; "))
		os.Exit(1)
	}
}
