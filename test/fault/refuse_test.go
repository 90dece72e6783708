package fault

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The correctness review's faults: a broker that refuses connections (not a
// proxy that accepts them and then drops them), and a topic that refuses one
// event mid-stream, with a PostgreSQL fast shutdown while outboxd holds
// before it.
const (
	// faultBrokerRefused stops the broker and refuses connections at its
	// address (the proxy cuts) until it is back: a session reset in
	// exactly-once mode must wait for it, not end outboxd.
	faultBrokerRefused faultKind = "broker-refused"
	// faultTopicRefuses lowers a topic's max.message.bytes, writes one event
	// over it (outboxd holds before it), restarts PostgreSQL fast while it
	// holds (the restart must not wait on outboxd), then raises the limit:
	// the held event is delivered without a restart of outboxd.
	faultTopicRefuses faultKind = "topic-refuses-event"
)

// refusedTopicLimit is the max.message.bytes the fault sets: above every
// event of the load (maxPad 400), below the one it writes.
const refusedTopicLimit = 2000

func (w *world) injectRefusal(kind faultKind) (string, error) {
	switch kind {
	case faultBrokerRefused:
		if err := w.kafka.Stop(); err != nil {
			return "", err
		}
		down := w.jitter(2*time.Second, 5*time.Second)
		w.kafkaProxies.Cut(down)
		sleepCtx(w.ctx, down)
		return fmt.Sprintf("refused %v", down.Round(time.Millisecond)), w.kafka.Start(w.ctx)
	case faultTopicRefuses:
		return w.topicRefuses()
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}

func (w *world) topicRefuses() (string, error) {
	cl, err := kgo.NewClient(w.kafkaOpts()...)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic, agg := w.topics[len(w.topics)-1], aggTypes[len(aggTypes)-1]
	setLimit := func(v string) error {
		ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
		defer cancel()
		resp, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic)
		if err == nil {
			err = resp[0].Err
		}
		return err
	}
	if err := setLimit(strconv.Itoa(refusedTopicLimit)); err != nil {
		return "", fmt.Errorf("lowering max.message.bytes of %s: %w", topic, err)
	}
	if err := w.load.writeOne(w.ctx, agg, 3*refusedTopicLimit); err != nil {
		_ = setLimit("1048588")
		return "", fmt.Errorf("writing the oversized event: %w", err)
	}
	// outboxd holds before it (on-invalid fail).
	held := time.Now()
	for w.blocked() != 1 {
		if time.Since(held) > 60*time.Second || w.ctx.Err() != nil {
			_ = setLimit("1048588")
			return "", fmt.Errorf("outboxd did not hold before the refused event within 60s")
		}
		sleepCtx(w.ctx, 20*time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(w.ctx, pgRestartBound)
	rs := time.Now()
	err = w.pg.Restart(ctx, "fast")
	cancel()
	took := time.Since(rs)
	if err != nil {
		err = fmt.Errorf("PostgreSQL fast restart did not finish within %v while outboxd held: %w", pgRestartBound, err)
	}
	// Raise it back to Kafka's default: the held event is retried and
	// delivered, in order, without restarting outboxd.
	if e := setLimit("1048588"); err == nil {
		err = e
	}
	return fmt.Sprintf("held after %v, pg restart %v", rs.Sub(held).Round(time.Millisecond), took.Round(time.Millisecond)), err
}

// blocked reads outboxd_blocked from the active outboxd (-1 if unknown).
func (w *world) blocked() float64 {
	w.relayMu.Lock()
	addr := w.httpAddr[w.relay]
	w.relayMu.Unlock()
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "outboxd_blocked "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return f
		}
	}
	return -1
}
