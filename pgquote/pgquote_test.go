package pgquote

import "testing"

func TestLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"outboxd":                       `'outboxd'`,
		"o'k":                           `'o''k'`,
		`x\'; CREATE TABLE pwned(); --`: `E'x\\''; CREATE TABLE pwned(); --'`,
		"a\x00b":                        `'ab'`,
	} {
		if got := Literal(in); got != want {
			t.Errorf("Literal(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestIdent(t *testing.T) {
	if got := Ident(`we"ird`); got != `"we""ird"` {
		t.Fatal(got)
	}
}

func TestInDollarQuote(t *testing.T) {
	if _, err := InDollarQuote("p$outboxd$; DROP TABLE x; --"); err == nil {
		t.Fatal("accepted the dollar tag")
	}
	if s, err := InDollarQuote("'a$b'"); err != nil || s != "'a$b'" {
		t.Fatal(s, err)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"outboxd", "Outbox_2", "_x"} {
		if err := ValidateName("publication", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1x", `x\'; CREATE TABLE pwned(); --`, "a-b", "a$outboxd$", string(make([]byte, 64))} {
		if err := ValidateName("publication", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestIdentMinimal(t *testing.T) {
	for in, want := range map[string]string{"outbox": "outbox", "_x1": "_x1", "Outbox": `"Outbox"`, "a$b": `"a$b"`, `we"ird`: `"we""ird"`, "1a": `"1a"`} {
		if got := IdentMinimal(in); got != want {
			t.Errorf("IdentMinimal(%q) = %s, want %s", in, got, want)
		}
	}
}
