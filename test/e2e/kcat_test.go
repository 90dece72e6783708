package e2e

import (
	"context"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

// kcat (librdkafka) is a third-party client: it must read exactly the bytes a
// Java or librdkafka consumer would expect.
func TestKcatReadsEvents(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat not installed (apt-get install kcat; .ci/run installs it)")
	}
	f := newFixture(t)
	f.startRelay()
	end := f.commit(
		event{1, "order-1", "OrderCreated", `{"total": 10}`},
		event{2, "order-2", "OrderCreated", `{"total": 20}`},
	)
	f.waitConfirmed(end, 20*time.Second)
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kcat, "-C", "-b", strings.Join(f.kafka.Brokers(), ","), "-t", f.topic(),
		"-o", "beginning", "-e", "-q", "-f", `%k|%h|%s\n`).CombinedOutput()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	sort.Strings(lines)
	want := []string{
		"order-1|id=" + eventID(1) + ",type=OrderCreated|" + `{"total": 10}`,
		"order-2|id=" + eventID(2) + ",type=OrderCreated|" + `{"total": 20}`,
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("kcat read:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
