package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// Kill rounds in the dbzserver case: one drain per relay and per fault, on
// a slot of its own (created before the backlog: the same WAL). When half
// the backlog is in the broker the bench either SIGKILLs the relay and
// starts it again (Debezium Server on the same offsets file, as a
// supervisor would), or SIGKILLs the broker and starts it again (the
// harness's Kill and Start) and leaves the relay alone: if the relay exits
// by itself, the bench starts it again once. When the broker has held at
// least the backlog for killQuiet, the relay is stopped and a consumer
// reads the whole stream or queue back against the commit order: lost
// events, duplicates, order violations.
const (
	KillRelay  = "relay"
	KillBroker = "broker"
)

// killSlots are the rounds, in their order: relay kills first.
var killSlots = []struct{ relay, killed, slot string }{
	{"outboxd", KillRelay, "krob"}, {"Debezium Server", KillRelay, "krdz"},
	{"outboxd", KillBroker, "kbob"}, {"Debezium Server", KillBroker, "kbdz"},
}

// killBound bounds each round from its fault to the last event arriving.
const killBound = 2 * time.Minute

// KillRun is one kill round.
type KillRun struct {
	Relay  string // "outboxd" or "Debezium Server"
	Killed string // KillRelay or KillBroker
	At     int64  // messages in the broker when it was killed
	// Exited: after a broker kill the relay exited by itself (the bench
	// started it again).
	Exited bool
	// Complete: every event arrived within killBound of the fault.
	Complete bool
	Order    OrderRun
	Err      string // the round could not be run to its end
}

// relayProc is a running relay of a kill round.
type relayProc struct {
	proc  *harness.Proc
	close func()
}

// startRelay starts one of the two relays on slot; Debezium Server keeps
// its offsets in offsets (one file across its restarts).
func (e *Env) startRelay(ctx context.Context, w *world, relay, slot, offsets string) (relayProc, error) {
	if relay == "outboxd" {
		o, err := e.startOutboxd(ctx, w, slot, slot+"_"+time.Now().Format("150405.000"))
		if err != nil {
			return relayProc{}, err
		}
		return relayProc{o.Proc, func() { _ = o.stop() }}, nil
	}
	props, err := e.dbzServerProps(w, slot)
	if err != nil {
		return relayProc{}, err
	}
	props["debezium.source.offset.storage.file.filename"] = offsets
	s, err := harness.StartDebeziumServer(ctx, props, dbzServerJVM)
	if err != nil {
		return relayProc{}, err
	}
	return relayProc{s.Proc(), s.Close}, nil
}

// killRound runs one round of relay ("outboxd" or "Debezium Server") on
// slot, which holds want events; parent is not cancelled by the env's
// server watch (a broker kill is this round's doing).
func (e *Env) killRound(parent context.Context, w *world, ref map[int64]orderRef, relay, killed, slot string, want int64) (k KillRun, fatal error) {
	k = KillRun{Relay: relay, Killed: killed}
	ctx, cancel := context.WithTimeout(parent, caseTimeout(int(want))+killBound)
	defer cancel()
	fail := func(err error) (KillRun, error) {
		k.Err = err.Error()
		return k, nil
	}
	if err := e.mq.reset(ctx, w); err != nil {
		return k, err
	}
	if b, ok := e.mq.(*rabbitBench); ok && relay != "outboxd" {
		unbind, err := b.bindAll(w)
		if err != nil {
			return k, err
		}
		defer unbind()
	}
	dir, err := os.MkdirTemp("", "outboxd-bench-kill-")
	if err != nil {
		return k, err
	}
	defer os.RemoveAll(dir)
	offsets := filepath.Join(dir, "offsets.dat")
	r, err := e.startRelay(ctx, w, relay, slot, offsets)
	if err != nil {
		return fail(err)
	}
	defer func() { r.close() }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	wait := func(until func(n int64) bool, what string) error {
		for {
			n, err := w.topicCount(ctx)
			if err == nil && until(n) {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: %d of %d in the broker: %w; %s log tail:\n%s", what, n, want, ctx.Err(), relay, tailOf(r.proc.Log(), 2000))
			case <-tick.C:
			}
		}
	}
	if err := wait(func(n int64) bool {
		k.At = n
		return n >= want/2 || r.proc.Exited()
	}, "waiting for half the backlog"); err != nil {
		return fail(err)
	}
	if r.proc.Exited() {
		return fail(fmt.Errorf("%s exited before half the backlog arrived; log tail:\n%s", relay, tailOf(r.proc.Log(), 2000)))
	}
	switch killed {
	case KillRelay:
		_ = r.proc.Kill()
		r.close()
		if r, err = e.startRelay(ctx, w, relay, slot, offsets); err != nil {
			return fail(err)
		}
	case KillBroker:
		// The watch must not take the round's kill for a crash.
		e.setBrokerPIDs(nil)
		err := e.mq.restart(ctx)
		e.setBrokerPIDs(e.findBrokerPIDs())
		if err != nil {
			return k, fmt.Errorf("restarting %s: %w", e.mq.brokerIs(), err)
		}
	}
	faulted := time.Now()
	var full time.Time
	for time.Since(faulted) < killBound {
		if r.proc.Exited() && !k.Exited {
			k.Exited = true
			r.close()
			if r, err = e.startRelay(ctx, w, relay, slot, offsets); err != nil {
				return fail(err)
			}
		}
		n, err := w.topicCount(ctx)
		switch {
		case err != nil || n < want:
			full = time.Time{}
		case full.IsZero():
			full = time.Now()
		case time.Since(full) >= killQuiet:
			k.Complete = true
		}
		if k.Complete {
			break
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-tick.C:
		}
	}
	r.close()
	n, err := w.topicCount(ctx)
	if err != nil {
		return fail(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	seqs, err := e.readBack(rctx, w, n, 500*time.Millisecond)
	if err != nil {
		return fail(err)
	}
	if k.Order, err = checkOrder(ref, seqs); err != nil {
		return fail(err)
	}
	return k, nil
}

// killQuiet is how long the broker must hold the whole backlog before a
// kill round ends (a relay that replays after a restart may still be
// sending duplicates).
const killQuiet = time.Second

// killCell is one round's outcome in a report cell.
func killCell(k KillRun) string {
	if k.Err != "" {
		return "not run to its end: " + short(errors.New(k.Err))
	}
	s := fmt.Sprintf("%s lost, %s duplicates, %d order violations (killed at %s)", commas(k.Order.Lost), commas(k.Order.Dups), k.Order.Violations, commas(k.At))
	switch {
	case k.Killed == KillBroker && k.Exited:
		s += "; the relay exited (restarted by the bench)"
	case k.Killed == KillBroker:
		s += "; the relay recovered by itself"
	}
	if !k.Complete {
		s += fmt.Sprintf("; backlog not complete within %.0f s", killBound.Seconds())
	}
	return s
}

// killRows are the kill rounds' rows, one per fault: outboxd's round
// beside Debezium Server's.
func killRows(ks []KillRun) []row {
	var rows []row
	for _, killed := range []string{KillRelay, KillBroker} {
		cells := map[string]string{}
		for _, k := range ks {
			if k.Killed == killed {
				cells[k.Relay] = killCell(k)
			}
		}
		if len(cells) == 0 {
			continue
		}
		what := map[string]string{KillRelay: "SIGKILL of the relay at half the drain, started again",
			KillBroker: "SIGKILL of the broker at half the drain, started again"}[killed]
		rows = append(rows, row{"", "  ″ " + what + ": at a consumer reading the stream/queue back", cells["outboxd"], cells["Debezium Server"], "—", "0 lost", "—"})
	}
	return rows
}
