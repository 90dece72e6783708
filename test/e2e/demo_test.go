package e2e

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// `make run` must work on a fresh machine: the demo starts its own
// PostgreSQL and broker, relays the sample orders and prints them.
func TestMakeRunDemo(t *testing.T) {
	ctx, bin, root := buildDemo(t)
	cmd := exec.CommandContext(ctx, bin, "-once", "-http-addr", harness.FreeAddr(t))
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

// `make run` on a machine where 9187 is taken moves to a free port and says
// so; killed hard (SIGKILL of its parent, as of make), it leaves neither
// outboxd nor PostgreSQL behind: both stop listening.
func TestMakeRunDemoPortTakenAndKilledHard(t *testing.T) {
	ctx, bin, root := buildDemo(t)
	// Taken either way: by this listener, or by whoever holds it already.
	if ln, err := net.Listen("tcp", "127.0.0.1:9187"); err == nil {
		defer ln.Close()
	}
	var out harness.SyncBuffer
	parent := exec.Command("/bin/sh", "-c", `"$0" -every 1h & wait`, bin) // the parent stands for make
	parent.Dir, parent.Stdout, parent.Stderr = root, &out, &out
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = parent.Process.Kill(); _ = parent.Wait() })

	streaming := regexp.MustCompile(`outboxd is streaming; metrics at http://(127\.0\.0\.1:\d+)/metrics`)
	var httpAddr string
	for httpAddr == "" {
		if ctx.Err() != nil {
			t.Fatalf("demo did not stream:\n%s", out.String())
		}
		if m := streaming.FindStringSubmatch(out.String()); m != nil {
			httpAddr = m[1]
		}
		time.Sleep(50 * time.Millisecond) // polls the demo's output for its address; the state is then read over HTTP
	}
	if httpAddr == "127.0.0.1:9187" || !strings.Contains(out.String(), "127.0.0.1:9187 is taken: outboxd's HTTP endpoints use "+httpAddr) {
		t.Fatalf("want a move off the taken port, said once:\n%s", out.String())
	}
	pgAddr := regexp.MustCompile(`--postgres postgres://[^@ ]*@(127\.0\.0\.1:\d+)/`).FindStringSubmatch(out.String())
	if pgAddr == nil {
		t.Fatalf("no PostgreSQL address in:\n%s", out.String())
	}
	if resp, err := http.Get("http://" + httpAddr + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	if err := parent.Process.Kill(); err != nil { // SIGKILL: the parent runs no cleanup
		t.Fatal(err)
	}
	_ = parent.Wait()
	for _, addr := range []string{httpAddr, pgAddr[1]} {
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				break
			}
			c.Close()
			if ctx.Err() != nil {
				t.Fatalf("%s still listening after the parent was killed:\n%s", addr, out.String())
			}
			time.Sleep(100 * time.Millisecond) // polls until the listener is gone
		}
	}
	if !strings.Contains(out.String(), "outboxd stopped") {
		t.Errorf("demo did not stop outboxd itself:\n%s", out.String())
	}
}

// buildDemo builds the demo (test/cmd/demo, what make run runs) and returns
// it, the repository's root it runs in, and a context for the test.
func buildDemo(t *testing.T) (ctx context.Context, bin, root string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	bin, err := harness.BuildBinary(ctx, "./test/cmd/demo")
	if err != nil {
		t.Fatal(err)
	}
	if root, err = harness.ModuleRoot(); err != nil {
		t.Fatal(err)
	}
	return ctx, bin, root
}
