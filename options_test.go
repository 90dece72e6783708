package outboxd

import (
	"encoding"
	"testing"
)

// Each choice round-trips through its flag word; the zero value is the
// default; an unknown word or value is refused.
func TestChoicesText(t *testing.T) {
	for _, c := range []struct {
		v interface {
			encoding.TextMarshaler
			encoding.TextUnmarshaler
			String() string
		}
		words []string
		zero  string
	}{
		{new(OnInvalid), []string{"fail", "dead-letter"}, "fail"},
		{new(SlotFailover), []string{"auto", "true", "false"}, "auto"},
		{new(PgoutputBinary), []string{"off", "auto"}, "off"},
	} {
		if c.v.String() != c.zero {
			t.Errorf("zero value %q, want %q", c.v.String(), c.zero)
		}
		for _, w := range c.words {
			if err := c.v.UnmarshalText([]byte(w)); err != nil {
				t.Fatal(err)
			}
			if b, err := c.v.MarshalText(); err != nil || string(b) != w || c.v.String() != w {
				t.Errorf("%q came back as %q, %v", w, b, err)
			}
		}
		if err := c.v.UnmarshalText([]byte("drop")); err == nil {
			t.Errorf("%T took \"drop\"", c.v)
		}
	}
	if _, err := OnInvalid(5).MarshalText(); err == nil || OnInvalid(5).String() != "OnInvalid(5)" {
		t.Error("OnInvalid(5) marshalled")
	}
}
