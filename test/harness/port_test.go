package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
)

// onFreePort tries three ports while the start fails for a taken port, and
// stops at the first failure that is something else, or once ctx ended.
func TestOnFreePort(t *testing.T) {
	taken, other := errors.New("address already in use"), errors.New("bad config")
	isTaken := func(err error) bool { return err == taken }
	for name, tc := range map[string]struct {
		errs    []error // what each start returns
		taken   func(error) bool
		cancel  bool
		want    error
		attempt int
	}{
		"first port":          {errs: []error{nil}, taken: isTaken, want: nil, attempt: 1},
		"taken once":          {errs: []error{taken, nil}, taken: isTaken, want: nil, attempt: 2},
		"taken thrice":        {errs: []error{taken, taken, taken}, taken: isTaken, want: taken, attempt: 3},
		"other failure":       {errs: []error{other}, taken: isTaken, want: other, attempt: 1},
		"any failure retried": {errs: []error{other, other, nil}, want: nil, attempt: 3},
		"ctx ended":           {errs: []error{taken}, taken: isTaken, cancel: true, want: taken, attempt: 1},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			var port, attempt int
			err := onFreePort(ctx, &port, func() error {
				if port == 0 {
					t.Error("start ran without a port")
				}
				port = 0 // the next start must get one again
				attempt++
				return tc.errs[attempt-1]
			}, tc.taken)
			if err != tc.want || attempt != tc.attempt {
				t.Fatalf("err %v after %d starts, want %v after %d", err, attempt, tc.want, tc.attempt)
			}
		})
	}
}

// FreePorts returns distinct ports, each free again once it returns: the
// ports it held while picking are released for the servers to bind.
func TestFreePortsDistinct(t *testing.T) {
	ports, err := FreePorts(64)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("port %d twice or invalid in %v", p, ports)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d still held after FreePorts returned: %v", p, err)
		}
		l.Close()
	}
	if len(ports) != 64 {
		t.Fatalf("%d ports, want 64", len(ports))
	}
}
