package outboxd

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
)

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

func jsonMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// Issue 26 item 13: /status's slot_server_view and `outboxd status --json`'s
// slots are one schema: every key /status shows for the slot is a key of
// status --json with the same value (null where PostgreSQL has none, never
// -1), all keys snake_case, and the whole /status document too.
func TestStatusAndStatusJSONOneSchema(t *testing.T) {
	i64 := func(n int64) *int64 { return &n }
	for name, s := range map[string]slot.Slot{
		"active, unlimited keep size": {Name: "outboxd", Type: "logical", Plugin: "pgoutput", Database: "app", Active: true, ActivePID: 4242,
			ConfirmedFlush: 0x2FFF000, RestartLSN: 0x2000000, LagBytes: i64(4096), RetainedBytes: i64(16 << 20), WALStatus: "reserved", Failover: true},
		"inactive, bounded keep size": {Name: "outboxd", Type: "logical", Plugin: "pgoutput", Database: "app",
			ConfirmedFlush: 0x1000000, LagBytes: i64(1 << 20), RetainedBytes: i64(2 << 20), WALStatus: "extended", SafeWALSize: i64(1 << 30)},
		"never confirmed": {Name: "outboxd", Type: "logical", Plugin: "pgoutput", Database: "app", LagBytes: i64(0), RetainedBytes: i64(0), WALStatus: "reserved"},
	} {
		t.Run(name, func(t *testing.T) {
			cli := jsonMap(t, slot.Listed{Slot: s, Selected: true})
			at := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
			st := &state{slotName: "outboxd", slot: newSlotView(s, true, at)}
			doc := jsonMap(t, st.status())
			for k := range doc {
				if !snakeCase.MatchString(k) {
					t.Errorf("/status key %q is not snake_case", k)
				}
			}
			view, ok := doc["slot_server_view"].(map[string]any)
			if !ok {
				t.Fatalf("/status has no slot_server_view: %v", doc)
			}
			for k, v := range view {
				if !snakeCase.MatchString(k) {
					t.Errorf("slot_server_view key %q is not snake_case", k)
				}
				switch k {
				case "found":
					if v != true {
						t.Errorf("found = %v", v)
					}
					continue
				case "polled_at":
					if v != "2026-12-02T01:00:00Z" {
						t.Errorf("polled_at = %v", v)
					}
					continue
				}
				cv, ok := cli[k]
				if !ok {
					t.Errorf("/status slot_server_view.%s is not in status --json", k)
					continue
				}
				if cv != v {
					t.Errorf("%s: /status %v (%T), status --json %v (%T)", k, v, v, cv, cv)
				}
			}
			if len(view) < 12 {
				t.Errorf("slot_server_view has %d keys: %v", len(view), view)
			}
		})
	}
}

// docs/operations.md's list of /status keys is every key /status can show: a state
// with everything set is rendered and each key looked up in the list.
func TestStatusKeysDocumented(t *testing.T) {
	readme, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(readme), "`/status` keys (snake_case;")
	if i < 0 {
		t.Fatal("docs/operations.md has no list of /status keys")
	}
	list := string(readme)[i:]
	list = list[:strings.Index(list, "\n\n")]
	st := &state{slotName: "outboxd", warnings: []string{"w"}, unprotected: []string{"s"}, holder: "PID 1",
		topicHolds: map[string]string{"t": "held"}, lastErr: "e", lastErrAt: time.Now(), heartbeatErr: "h",
		slot: newSlotView(slot.Slot{Name: "outboxd"}, true, time.Now()), checkpointWait: &sink.CheckpointWait{}}
	st.wm = slot.NewWatermark(100)
	doc := jsonMap(t, st.status())
	view := doc["slot_server_view"].(map[string]any)
	for _, m := range []map[string]any{doc, view} {
		for k := range m {
			if !strings.Contains(list, "`"+k+"`") {
				t.Errorf("/status key %q is not in docs/operations.md's list", k)
			}
		}
	}
	for _, k := range []string{"role", "streaming", "starting", "waiting_for_kafka", "checkpoint_wait"} {
		if !strings.Contains(list, "`"+k+"`") {
			t.Errorf("starting /status key %q is not in docs/operations.md's list", k)
		}
	}
}
