package pgerr

import (
	"errors"
	"testing"
)

func TestRootCauseFirst(t *testing.T) {
	for in, want := range map[string]string{
		"connect to postgres db:5432 as \"u\": failed to connect to `user=u database=app`:\n\tdb:5432 (db): tls error: server refused TLS connection\n\tdb:5432 (db): server error: FATAL: password authentication failed for user \"u\" (SQLSTATE 28P01)": "connect to postgres db:5432 as \"u\": failed to connect to `user=u database=app`: db:5432 (db): server error: FATAL: password authentication failed for user \"u\" (SQLSTATE 28P01) (also tried: db:5432 (db): tls error: server refused TLS connection)",
		"failed to connect to `user=u database=app`:\n\ta: dial error: refused\n\tb: dial error: refused":                                                                                                                                                  "failed to connect to `user=u database=app`: a: dial error: refused (also tried: b: dial error: refused)",
		"failed to connect to `user=u database=app`: a: dial error: refused":                                                                                                                                                                               "failed to connect to `user=u database=app`: a: dial error: refused",
		"something else": "something else",
	} {
		orig := errors.New(in)
		got := RootCauseFirst(orig)
		if got.Error() != want {
			t.Errorf("%q\n got %q\nwant %q", in, got.Error(), want)
		}
		if !errors.Is(got, orig) {
			t.Errorf("%q: the original error is not in the chain", in)
		}
	}
	if RootCauseFirst(nil) != nil {
		t.Error("nil")
	}
}
