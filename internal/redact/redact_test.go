package redact

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func TestRedactDSN(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// URL form.
		{"postgres://u:secret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgresql://u:secret@h:5432/db?sslmode=disable", "postgresql://u:xxxxx@h:5432/db?sslmode=disable"},
		{"postgres://u:s%40cr%2Fet@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:p@ss/w:rd@h1:5432,h2:5433/db", "postgres://u:xxxxx@h1:5432,h2:5433/db"},
		{"postgres://u@h/db?password=secret&sslmode=require", "postgres://u@h/db?password=xxxxx&sslmode=require"},
		{"postgres://u@h/db?sslpassword=keypass", "postgres://u@h/db?sslpassword=xxxxx"},
		{"POSTGRES://u:secret@h/db", "POSTGRES://u:xxxxx@h/db"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"postgres://h:5432/db", "postgres://h:5432/db"},
		{"postgres:///db?host=/tmp", "postgres:///db?host=/tmp"},
		// Keyword/value form.
		{"host=h user=u password=secret dbname=db", "host=h user=u password=xxxxx dbname=db"},
		{"host=h password='a b' dbname=db", "host=h password=xxxxx dbname=db"},
		{`host=h password='it\'s a secret' dbname=db`, "host=h password=xxxxx dbname=db"},
		{"host=h password = secret dbname=db", "host=h password = xxxxx dbname=db"},
		{"password=secret", "password=xxxxx"},
		{"host=h password='unterminated dbname=db", "host=h password=xxxxx"},
		{"host=h sslpassword=keypass password=pw", "host=h sslpassword=xxxxx password=xxxxx"},
		{"host=h PASSWORD=secret", "host=h PASSWORD=xxxxx"},
		{"host=h user=u dbname=db", "host=h user=u dbname=db"},
		{"", ""},
	} {
		if got := redactDSN(tc.in); got != tc.want {
			t.Errorf("redactDSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRedactText(t *testing.T) {
	dsn := "postgres://app:hunter22@db.internal/orders"
	msg := "connect failed for `postgres://app:hunter22@db.internal/orders`: bad password hunter22; also password='x y' and password=plain, then host=h"
	got := String(msg, dsn)
	for _, leak := range []string{"hunter22", "x y", "plain"} {
		if strings.Contains(got, leak) {
			t.Errorf("String leaks %q: %s", leak, got)
		}
	}
	for _, keep := range []string{"postgres://app:xxxxx@db.internal/orders`", "password=xxxxx and", "then host=h"} {
		if !strings.Contains(got, keep) {
			t.Errorf("String lost %q: %s", keep, got)
		}
	}
	// A keyword/value DSN's password, quoted with escapes, is found literally
	// once parsed.
	kv := `host=h password='a\'b c d' dbname=x`
	if got := String("error: the server said a'b c d is wrong", kv); strings.Contains(got, "a'b c d") {
		t.Errorf("literal password leaked: %s", got)
	}
}

func TestErr(t *testing.T) {
	if Err(nil, "x") != nil {
		t.Fatal("nil error must stay nil")
	}
	base := errors.New("dial postgres://u:topsecret@h/db: refused")
	err := Err(fmt.Errorf("setup: %w", base), "postgres://u:topsecret@h/db")
	if strings.Contains(err.Error(), "topsecret") || !strings.Contains(err.Error(), "u:xxxxx@h") {
		t.Errorf("redactErr = %q", err)
	}
	if !errors.Is(err, base) {
		t.Error("redactErr must keep the chain for errors.Is")
	}
	if got := Err(flag.ErrHelp, "postgres://u:topsecret@h/db"); got != flag.ErrHelp {
		t.Errorf("an error without secrets must pass unchanged, got %v", got)
	}
}
