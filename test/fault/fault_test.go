// Package fault is outboxd's fault-injection suite: real PostgreSQL, a kfake
// broker process and the outboxd binary run as separate processes while
// writers commit a mixed outbox load; outboxd is SIGKILLed, the broker is
// stopped and frozen, PostgreSQL restarted, the walsender terminated, and
// both of outboxd's network paths go through loopback proxies that delay,
// stall and cut. Afterwards every topic is read and checked: no committed
// event lost, no rolled-back event published, per-aggregate order of first
// occurrences equal to commit order, duplicates counted; throughout, a
// monitor checks that confirmed_flush_lsn never passes an event Kafka does
// not hold (monitor_test.go explains why that check is sound).
//
//	go test ./test/fault/ -run TestFaultsShort -v        # ~1 min, part of make test
//	go test ./test/fault/ -run TestFaultsShort -kafka apache-cluster -v  # ~2 min, part of make test
//	make soak                                            # TestSoak, both brokers, both modes
//
// With -kafka apache-cluster the broker is a 3-node Apache Kafka cluster
// (kafka_test.go) and the broker faults are those of single nodes
// (cluster_test.go): partition-leader, controller and coordinator kills, a
// stalled node, a rolling restart, two of three nodes down.
//
// Flags: -soak, -mode (delivery mode, see mode_test.go), -kafka, -seed,
// -outboxd-bin, -keep-logs.
package fault

import (
	"flag"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

var (
	soak       = flag.Bool("soak", false, "run TestSoak, the long fault-injection soak (make soak)")
	modeName   = flag.String("mode", "at-least-once", "delivery mode under test (at-least-once, exactly-once)")
	seedFlag   = flag.Uint64("seed", 0, "random seed for load and fault timing (0: from the clock; printed in the summary)")
	keepLogs   = flag.String("keep-logs", "", "write process logs (outboxd, broker) under this directory and keep them")
	outboxdBin = flag.String("outboxd-bin", "", "outboxd binary to test (default: build ./cmd/outboxd)")
)

func TestMain(m *testing.M) {
	RunBrokerIfChild() // the broker child process never returns from here
	os.Exit(m.Run())
}

func seed() uint64 {
	if *seedFlag != 0 {
		return *seedFlag
	}
	return uint64(time.Now().UnixNano())
}

func mode(t *testing.T) deliveryMode {
	m, err := lookupMode(*modeName)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var aggTypes = []string{"Order", "Customer", "Payment"}

// TestFaultsShort is the quick version for make test: a few SIGKILLs (one
// while a burst is in flight), a SIGTERM, one broker stop and stall, one
// PostgreSQL fast restart, one walsender termination, a cut on each proxy,
// a PostgreSQL-side stall and blackhole, a Kafka-side delay and a fast
// restart of PostgreSQL while Kafka is down, under a few thousand events.
func TestFaultsShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a broker and outboxd (-short)")
	}
	sc := scenario{
		name: "short",
		load: loadConfig{
			writers: 3, pauseMin: 150 * time.Millisecond, pauseMax: 300 * time.Millisecond,
			pBulk: 0.02, pTen: 0.35, bulkSize: 500,
			pRollback: 0.1, pInsertDelete: 0.1,
			aggTypes: aggTypes, aggIDs: 12, maxPad: 200, pSlowCommit: 0.2,
		},
		faults: []faultKind{
			faultKill, faultBrokerStop, faultKillUnderLag, faultPGRestart, faultWalsenderKill,
			faultPGProxyCut, faultKill, faultKafkaCut, faultBrokerStall, faultTerm, faultPGProxyStall, faultKafkaDelay,
			faultPGBlackhole, faultPGRestartBrokerDown, faultBrokerRefused, faultTopicRefuses,
		},
		// A silently dead replication connection (pg-proxy-blackhole) is
		// only noticed after --replication-timeout (default 30s).
		relayArgs:   []string{"--replication-timeout", "5s"},
		spread:      50 * time.Second,
		warmup:      3 * time.Second,
		cooldown:    2 * time.Second,
		catchUp:     90 * time.Second,
		settleBound: 60 * time.Second,
	}
	m := mode(t)
	if kind, err := worldKafkaKind(); err == nil && kind == harness.KindApacheCluster {
		// On the 3-node Apache cluster: the broker faults a real cluster
		// has, plus a few outboxd and PostgreSQL ones.
		sc.name = "short-cluster"
		sc.faults = []faultKind{
			faultLeaderKill, faultKill, faultNodeStall, faultControllerKill, faultKafkaCut,
			faultTwoDown, faultKillUnderLag, faultRollingRestart, faultPGRestart, faultTopicRefuses,
		}
		if m.transactional {
			sc.faults = append(sc.faults, faultTxnCoordKill)
		}
		sc.relayArgs = nil
		sc.spread = 40 * time.Second
	}
	w := newWorld(t, sc, m, seed())
	w.run()
}

// TestSoak is the long run (make soak): ≥ 20 SIGKILLs at random moments
// plus every other fault several times, in random order, for ~10 minutes
// under a heavier load.
func TestSoak(t *testing.T) {
	if !*soak {
		t.Skip("long fault-injection soak: run make soak (go test ./test/fault/ -run TestSoak -soak)")
	}
	s := seed()
	plan := map[faultKind]int{
		faultKill: 18, faultKillUnderLag: 6, faultKillBrokerDown: 2,
		faultTerm: 3, faultTermBrokerStall: 2,
		faultBrokerStop: 5, faultBrokerStall: 4, faultBrokerLongStall: 1,
		faultPGRestart: 4, faultPGCrash: 2, faultWalsenderKill: 4,
		faultPGProxyCut: 3, faultPGProxyStall: 2, faultPGProxyDelay: 2,
		faultKafkaCut: 3, faultKafkaStall: 2, faultKafkaDelay: 2, faultKafkaBlackhole: 2,
		faultPGBlackhole: 2, faultPGRestartBrokerDown: 2,
		faultBrokerRefused: 2, faultTopicRefuses: 2,
	}
	m := mode(t)
	if kind, err := worldKafkaKind(); err == nil && kind == harness.KindApacheCluster {
		// Whole-cluster stops and stalls give way to the faults of single
		// nodes: leaders, the controller, the coordinator, rolling restarts
		// and the loss of two of three.
		for _, k := range []faultKind{faultKillBrokerDown, faultTermBrokerStall, faultBrokerStop, faultBrokerStall, faultBrokerLongStall, faultPGRestartBrokerDown, faultBrokerRefused} {
			delete(plan, k)
		}
		plan[faultLeaderKill], plan[faultNodeStall], plan[faultControllerKill] = 5, 4, 3
		plan[faultRollingRestart], plan[faultTwoDown] = 2, 2
		if m.transactional {
			plan[faultTxnCoordKill] = 3
		}
	}
	var faults []faultKind
	for k, n := range plan {
		for range n {
			faults = append(faults, k)
		}
	}
	slices.Sort(faults)
	rng := rand.New(rand.NewPCG(s, 0xfa17))
	rng.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	sc := scenario{
		name: "soak",
		load: loadConfig{
			writers: 4, pauseMin: 80 * time.Millisecond, pauseMax: 250 * time.Millisecond,
			pBulk: 0.03, pTen: 0.35, bulkSize: 500,
			pRollback: 0.1, pInsertDelete: 0.1,
			aggTypes: aggTypes, aggIDs: 40, maxPad: 400, pSlowCommit: 0.3,
		},
		// A tight in-flight bound: 500-event transactions hit back-pressure.
		relayArgs: []string{"--max-inflight-events", "1000"},
		faults:    faults,
		spread:    9 * time.Minute,
		warmup:    10 * time.Second,
		cooldown:  10 * time.Second,
		catchUp:   3 * time.Minute,
		// A SIGKILL soon after a blackhole finds the slot held by the
		// orphaned walsender until wal_sender_timeout (60s) ends it.
		settleBound: 2 * time.Minute,
	}
	w := newWorld(t, sc, m, s)
	w.run()
}
