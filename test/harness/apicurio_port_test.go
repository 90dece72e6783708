package harness

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"
)

// TestApicurioPortTaken: a registry whose port another process took fails
// to start with the message portInUse knows, so StartApicurio tries a new
// port (onFreePort) instead of failing the test that wanted a registry.
func TestApicurioPortTaken(t *testing.T) {
	a := ApicurioForTest(t)
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", a.port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = a.Start(ctx)
	if err == nil || !portInUse(err) {
		t.Fatalf("start on a taken port: %v; want the port-in-use failure portInUse knows", err)
	}
}
