package inbox_test

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestEffectsExactlyOnce: orders committed while every part of the pipeline
// is killed or restarted once; every committed order charged exactly once, in
// per-account order, no rolled-back order charged; on each broker (Kafka,
// also with 4 key workers per partition, NATS JetStream, RabbitMQ: a
// classic queue, one with x-single-active-consumer, a quorum queue with it). With -soak
// the fault round repeats until the duration has passed.
func TestEffectsExactlyOnce(t *testing.T) {
	for _, broker := range []string{"kafka", "kafka-keyworkers", "nats", "rabbitmq", "rabbitmq-sac", "rabbitmq-quorum"} {
		t.Run(broker, func(t *testing.T) { testEffectsExactlyOnce(t, broker) })
	}
}

func testEffectsExactlyOnce(t *testing.T, broker string) {
	within := 3 * time.Minute
	if *soak > 0 {
		// The drain applies the backlog the faults built, at the handler's
		// pace (batches of one, 2 ms each): as long as the soak or longer
		// (the 5-minute subtests of 2026-12-03 took 360–705 s in all, -v
		// output). The drain fails by itself
		// on a 60 s stall; this deadline only bounds a hang, and a deadline
		// in the drain read as "none more for 60s" and as a consumer that
		// did not exit after SIGTERM (the effect soaks of 2026-12-02).
		within = 3**soak + 5*time.Minute
	}
	w := newWorld(t, within, broker)
	w.startRelay()
	w.startConsumer("c1", 1)

	stopProducing := w.startProducing(7)
	defer stopProducing()

	end := time.Now().Add(*soak)
	for round := 1; ; round++ {
		w.faultRound(round)
		if time.Now().After(end) {
			break
		}
	}
	stopProducing()
	w.drainAndCheck()
}

// faultRound is one of every fault, each once the pipeline made progress.
// c1 is running when it starts and when it returns.
func (w *world) faultRound(round int) {
	t := w.t
	step := func(what string) {
		t.Logf("round %d: %s (effects so far %d)", round, what, w.applied())
	}
	w.handOver(step, w.startConsumer, "c1", "c2", 10)
	w.startConsumer("c1", 1)
	w.progress(30, "c1 back")

	step("SIGTERM c2 during the rebalance that c1's return started")
	w.stopConsumer("c2")
	w.progress(20, "c1 after c2 left")

	step("broker restart")
	w.restartBroker()
	w.progress(30, "after the broker restart")

	step("billing database crash restart (immediate)")
	if err := w.billingPG.Restart(w.ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	w.progress(30, "after the billing restart")

	step("orders database restart (fast)")
	if err := w.ordersPG.Restart(w.ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	w.progress(30, "after the orders restart")

	step("SIGKILL outboxd, restart it")
	w.killRelay()
	w.progress(30, "after the outboxd restart")
}

// handOver is the consumer faults of both effect tests (consumers started by
// start): SIGKILL first mid-transaction and restart it with batch events per
// transaction, start second beside it, then SIGKILL first mid-transaction
// again, leaving second alone. Each step waits for progress.
func (w *world) handOver(step func(string), start func(name string, batch int, extra ...string), first, second string, batch int) {
	w.progress(30, "start")

	step(fmt.Sprintf("SIGKILL %s mid-transaction, restart it with %d events per transaction", first, batch))
	w.killMidTransaction(first)
	start(first, batch)
	w.progress(30, first+" after its kill")

	step(fmt.Sprintf("start %s: Kafka's cooperative rebalance hands it partitions %s had; on NATS and RabbitMQ it stands by", second, first))
	start(second, 1)
	w.progress(30, first+"+"+second)

	step(fmt.Sprintf("SIGKILL %s mid-transaction while %s runs: its partitions (stream, queue) move to %s", first, second, second))
	w.killMidTransaction(first)
	w.progress(30, second+" alone")
}

// drainAndCheck waits until every committed order is applied, stops the
// consumer gracefully, and checks the effects.
func (w *world) drainAndCheck() {
	t := w.t
	w.mu.Lock()
	committed, rolled := slices.Clone(w.committed), slices.Clone(w.rolled)
	w.mu.Unlock()
	// A long soak leaves a backlog: wait while it shrinks, fail once it
	// stalls for 60s. Shrinking counts events skipped as duplicates too: the
	// backlog can hold long runs of them (each outboxd start after the
	// orders database's restart publishes again from the slot's last saved
	// position, on PostgreSQL 15 often the slot's creation), during which
	// no new effect appears for a minute or more (the count logged below
	// passed a million for about 105k orders on Kafka and RabbitMQ in the
	// 5-minute soaks of 2026-12-03).
	last, lastMoved, skipped := w.applied(), time.Now(), 0
	for a := last; a < len(committed); a = w.applied() {
		if w.ctx.Err() != nil {
			t.Fatalf("the test's deadline passed while draining: %d of %d committed orders applied", last, len(committed))
		}
		if s := w.skipped(); s > skipped {
			skipped, lastMoved = s, time.Now()
		}
		if a > last {
			last, lastMoved = a, time.Now()
		}
		if time.Since(lastMoved) > 60*time.Second {
			t.Errorf("only %d of %d committed orders applied, none more and no duplicate skipped for 60s", a, len(committed))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the drain skipped %d duplicates (the running consumer's count)", skipped)
	for name, p := range w.consumers {
		if !p.Exited() {
			w.stopConsumer(name)
		}
	}
	t.Logf("%d orders committed, %d rolled back", len(committed), len(rolled))

	type entry struct {
		order   int64
		account string
		seq     int64
		cents   int64
	}
	rows, err := w.billing.Query(w.ctx, `SELECT order_id, account, seq, cents FROM ledger ORDER BY entry`)
	if err != nil {
		t.Fatal(err)
	}
	var ledger []entry
	for rows.Next() {
		var e entry
		if err := rows.Scan(&e.order, &e.account, &e.seq, &e.cents); err != nil {
			t.Fatal(err)
		}
		ledger = append(ledger, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// Per id: exactly once, nothing rolled back, nothing unknown.
	times := map[int64]int{}
	for _, e := range ledger {
		times[e.order]++
	}
	want := map[int64]order{}
	var wantSum int64
	for _, o := range committed {
		want[o.id] = o
		wantSum += o.cents
	}
	var doubled, missing, ghost []int64
	for _, o := range committed {
		switch n := times[o.id]; {
		case n == 0:
			missing = append(missing, o.id)
		case n > 1:
			doubled = append(doubled, o.id)
		}
	}
	for id := range times {
		if _, ok := want[id]; !ok {
			ghost = append(ghost, id)
		}
	}
	slices.Sort(ghost)
	if len(doubled)+len(missing)+len(ghost) > 0 {
		t.Errorf("effects: %d applied more than once %v, %d missing %v, %d never committed (rolled back or unknown) %v",
			len(doubled), head(doubled), len(missing), head(missing), len(ghost), head(ghost))
	}

	// Sums: the ledger's and the balances', against the committed orders.
	var ledgerSum, balanceSum int64
	for _, e := range ledger {
		ledgerSum += e.cents
	}
	if err := w.billing.QueryRow(w.ctx, `SELECT coalesce(sum(cents), 0) FROM balances`).Scan(&balanceSum); err != nil {
		t.Fatal(err)
	}
	if ledgerSum != wantSum || balanceSum != wantSum {
		t.Errorf("sum of charges: ledger %d, balances %d, committed orders %d", ledgerSum, balanceSum, wantSum)
	}

	// Order: each account's charges in the order the orders were placed.
	prev := map[string]int64{}
	for i, e := range ledger {
		if e.seq != prev[e.account]+1 {
			t.Errorf("ledger entry %d: account %s seq %d applied after seq %d", i+1, e.account, e.seq, prev[e.account])
			break
		}
		prev[e.account] = e.seq
	}
	var inbox int
	if err := w.billing.QueryRow(w.ctx, w.inboxRows).Scan(&inbox); err != nil {
		t.Fatal(err)
	}
	if inbox != len(committed) {
		t.Errorf("inbox rows %d, want %d (one per committed event)", inbox, len(committed))
	}
	if !t.Failed() {
		t.Logf("%d effects, each exactly once, in per-account order; sum %d", len(ledger), wantSum)
	}
}

func head(ids []int64) string {
	if len(ids) > 10 {
		return fmt.Sprint(ids[:10], "…")
	}
	return fmt.Sprint(ids)
}
