package outboxd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
)

// An unreachable PostgreSQL at startup is reported on every attempt, with
// the attempt, the wait before the next one and where to look, not once
// and then silence: a newcomer whose --postgres points nowhere sees the
// retries and the hint.
func TestProgressKeyLogsEveryRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&buf, nil))
		calls := 0
		key := func(ctx context.Context, dsn, slot string) (string, error) {
			calls++
			if calls <= 3 {
				return "", errors.New("dial tcp 127.0.0.1:5999: connect: connection refused")
			}
			return "7/outboxd", nil
		}
		k, err := progressKey(context.Background(), log, "postgres://u:secret@127.0.0.1:5999/app", "outboxd", key)
		if err != nil || k != "7/outboxd" {
			t.Fatalf("progressKey = %q, %v", k, err)
		}
		var warns []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			if m["level"] == "WARN" {
				warns = append(warns, m)
			}
		}
		if len(warns) != 3 {
			t.Fatalf("%d warnings for 3 failed attempts, want one each:\n%s", len(warns), buf.String())
		}
		for i, want := range []string{"500ms", "1s", "2s"} {
			w := warns[i]
			if w["attempt"] != float64(i+1) || w["retry_in"] != want || !strings.Contains(w["fix"].(string), "check --postgres") ||
				!strings.Contains(w["msg"].(string), "PostgreSQL") {
				t.Errorf("warning %d: %v, want attempt %d, retry_in %s and a fix naming --postgres", i, w, i+1, want)
			}
		}
		if strings.Contains(buf.String(), "secret") {
			t.Errorf("the log shows the password:\n%s", buf.String())
		}
	})
}
