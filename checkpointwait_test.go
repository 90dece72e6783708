package outboxd

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
)

type fakeWatcher struct{ w *sink.CheckpointWait }

func (f *fakeWatcher) CheckpointWait(context.Context) (*sink.CheckpointWait, error) { return f.w, nil }

// While the checkpoint read waits for its partition's last stable offset,
// /readyz's 503 names the partition, the offsets, the holding transaction
// and the kafka-transactions.sh commands, and /status shows checkpoint_wait
// (issue 22, item 5: before, /readyz said only "waiting for Kafka … read
// the checkpoint" for as long as it lasted). Once outboxd reads past a
// holder (it streams), /status still shows it, outboxd_waits false, and
// /readyz stays 200: delivery goes on. Gone from both once the stable
// offset moves.
func TestCheckpointWaitOnReadyzAndStatus(t *testing.T) {
	var logs bytes.Buffer
	st := &state{slotName: "s", starting: startingCheckpoint}
	w := &sink.CheckpointWait{Topic: "outboxd.checkpoints", Partition: 0, StableOffset: 41, EndOffset: 57, Since: time.Now().Add(-time.Minute), Waiting: true, Leader: 1,
		Holders: []sink.TxnHolder{{ProducerID: 7, ProducerEpoch: 2, StartOffset: 41, TransactionalID: "other.app", State: "Empty"}},
		Fix:     "kafka-transactions.sh --bootstrap-server b:9092 find-hanging --broker-id 1; kafka-transactions.sh --bootstrap-server b:9092 abort --topic outboxd.checkpoints --partition 0 --start-offset 41"}
	fw := &fakeWatcher{w: w}
	mo := &monitor{interval: time.Second, log: slog.New(slog.NewTextHandler(&logs, nil)), st: st, watcher: fw}
	mo.pollCheckpoint(context.Background())

	h := newHTTPHandler(newMetrics("test", st), st, false)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	code, body := get("/readyz")
	for _, want := range []string{"starting: " + startingCheckpoint, "checkpoint topic outboxd.checkpoints partition 0: last stable offset 41 below end offset 57",
		"producer id 7 (epoch 2) from offset 41", "transactional id other.app, which its coordinator no longer has open (state Empty): a hanging transaction",
		"outboxd waits for it to end", "find-hanging --broker-id 1", "abort --topic outboxd.checkpoints --partition 0 --start-offset 41"} {
		if code != 503 || !strings.Contains(body, want) {
			t.Fatalf("/readyz %d %q lacks %q", code, body, want)
		}
	}
	doc := jsonMap(t, st.status())
	cw, ok := doc["checkpoint_wait"].(map[string]any)
	if !ok {
		t.Fatalf("starting /status has no checkpoint_wait: %v", doc)
	}
	checkWaitSchema(t, cw)
	if cw["last_stable_offset"] != 41.0 || cw["end_offset"] != 57.0 || cw["outboxd_waits"] != true || cw["leader"] != 1.0 {
		t.Fatalf("checkpoint_wait %v", cw)
	}
	if !strings.Contains(logs.String(), "find-hanging --broker-id 1") {
		t.Fatalf("no warning with the commands: %s", logs.String())
	}

	// Streaming, reading past it.
	st.starting = ""
	st.streaming, st.brokerOK, st.wm = true, true, slot.NewWatermark(100)
	read := *w
	read.Waiting = false
	fw.w = &read
	mo.pollCheckpoint(context.Background())
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d %q while streaming past the transaction; want 200", code, body)
	}
	if cw, ok := jsonMap(t, st.status())["checkpoint_wait"].(map[string]any); !ok || cw["outboxd_waits"] != false {
		t.Fatalf("streaming /status checkpoint_wait %v", cw)
	}

	fw.w = nil
	mo.pollCheckpoint(context.Background())
	if _, ok := jsonMap(t, st.status())["checkpoint_wait"]; ok {
		t.Fatal("checkpoint_wait still shown after the stable offset moved")
	}
}

// checkWaitSchema: checkpoint_wait's keys, and its holders', are
// snake_case, and all of them are there.
func checkWaitSchema(t *testing.T, cw map[string]any) {
	t.Helper()
	for _, k := range []string{"topic", "partition", "last_stable_offset", "end_offset", "since", "outboxd_waits", "holders", "leader", "fix"} {
		if _, ok := cw[k]; !ok {
			t.Errorf("checkpoint_wait lacks %q: %v", k, cw)
		}
	}
	for k := range cw {
		if !snakeCase.MatchString(k) {
			t.Errorf("checkpoint_wait key %q is not snake_case", k)
		}
	}
	hs, _ := cw["holders"].([]any)
	for _, h := range hs {
		for k := range h.(map[string]any) {
			if !snakeCase.MatchString(k) {
				t.Errorf("checkpoint_wait.holders key %q is not snake_case", k)
			}
		}
	}
}
