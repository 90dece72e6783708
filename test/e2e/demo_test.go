package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// `make run` must work on a fresh machine: the demo starts its own
// PostgreSQL and broker, relays the sample orders and prints them.
func TestMakeRunDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := harness.BuildBinary(ctx, "./test/cmd/demo")
	if err != nil {
		t.Fatal(err)
	}
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "-once", "-http-addr", freeAddr(t))
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{
		"key=order-1 headers=[id=", "type=OrderPaid]", `value={"id": "order-1", "method": "card"}`,
		"topic=outbox.event.Customer", "key=order-3", "lag=",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "order-2") {
		t.Errorf("the rolled-back order was printed:\n%s", out)
	}
}
