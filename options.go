package outboxd

import "fmt"

// The typed choices of Config. Each zero value is the default; each
// unmarshals from, and prints as, the word its cmd/outboxd flag takes, so a
// flag or a config file parses with UnmarshalText.

// OnInvalid is what the relay does with an event the broker refuses for
// good (too large, a destination that does not exist, not authorised) or
// the router cannot render (--on-invalid).
type OnInvalid int

const (
	// OnInvalidFail holds the slot before the event and reports it on
	// /readyz and /status: nothing is skipped until someone fixes the row
	// or the broker. The default.
	OnInvalidFail OnInvalid = iota
	// OnInvalidDeadLetter publishes the event to Config.DeadLetterTopic
	// with the reason, and goes on.
	OnInvalidDeadLetter
)

// SlotFailover says whether the slot is created as a failover slot, which
// PostgreSQL 17+ copies to standbys (sync_replication_slots) so that it
// survives a promotion (--slot-failover).
type SlotFailover int

const (
	// SlotFailoverAuto makes a failover slot when the server supports it.
	// The default.
	SlotFailoverAuto SlotFailover = iota
	// SlotFailoverTrue requires one: older servers are a startup error.
	SlotFailoverTrue
	// SlotFailoverFalse makes an ordinary slot; an existing slot is left
	// as it is.
	SlotFailoverFalse
)

// PgoutputBinary says whether the relay asks for pgoutput's binary form
// (PostgreSQL 14+) (--pgoutput-binary). The records are the same bytes
// either way.
type PgoutputBinary int

const (
	// PgoutputBinaryOff always streams text. The default.
	PgoutputBinaryOff PgoutputBinary = iota
	// PgoutputBinaryAuto streams binary when the router renders every
	// column type of the publication's tables exactly as their text
	// (binary.go), which costs the walsender about 5% less CPU.
	PgoutputBinaryAuto
)

var (
	onInvalidWords      = []string{OnInvalidFail: "fail", OnInvalidDeadLetter: "dead-letter"}
	slotFailoverWords   = []string{SlotFailoverAuto: "auto", SlotFailoverTrue: "true", SlotFailoverFalse: "false"}
	pgoutputBinaryWords = []string{PgoutputBinaryOff: "off", PgoutputBinaryAuto: "auto"}
)

func (v OnInvalid) String() string      { return word(onInvalidWords, int(v), "OnInvalid") }
func (v SlotFailover) String() string   { return word(slotFailoverWords, int(v), "SlotFailover") }
func (v PgoutputBinary) String() string { return word(pgoutputBinaryWords, int(v), "PgoutputBinary") }

// MarshalText writes the flag's word.
func (v OnInvalid) MarshalText() ([]byte, error) {
	return marshalWord(onInvalidWords, int(v), "OnInvalid")
}

// MarshalText writes the flag's word.
func (v SlotFailover) MarshalText() ([]byte, error) {
	return marshalWord(slotFailoverWords, int(v), "SlotFailover")
}

// MarshalText writes the flag's word.
func (v PgoutputBinary) MarshalText() ([]byte, error) {
	return marshalWord(pgoutputBinaryWords, int(v), "PgoutputBinary")
}

// UnmarshalText parses "fail" or "dead-letter".
func (v *OnInvalid) UnmarshalText(b []byte) error {
	return unmarshalWord(onInvalidWords, (*int)(v), string(b), "on-invalid")
}

// UnmarshalText parses "auto", "true" or "false".
func (v *SlotFailover) UnmarshalText(b []byte) error {
	return unmarshalWord(slotFailoverWords, (*int)(v), string(b), "slot-failover")
}

// UnmarshalText parses "off" or "auto".
func (v *PgoutputBinary) UnmarshalText(b []byte) error {
	return unmarshalWord(pgoutputBinaryWords, (*int)(v), string(b), "pgoutput-binary")
}

func word(words []string, i int, typ string) string {
	if i >= 0 && i < len(words) {
		return words[i]
	}
	return fmt.Sprintf("%s(%d)", typ, i)
}

func marshalWord(words []string, i int, typ string) ([]byte, error) {
	if i < 0 || i >= len(words) {
		return nil, fmt.Errorf("outboxd: unknown %s(%d)", typ, i)
	}
	return []byte(words[i]), nil
}

func unmarshalWord(words []string, v *int, s, what string) error {
	for i, w := range words {
		if s == w {
			*v = i
			return nil
		}
	}
	return fmt.Errorf("%s: %q is not one of %q", what, s, words)
}

// valid reports whether each choice is one of its constants (a Config
// literal may hold any int).
func (c *Config) validChoices() error {
	for _, e := range []struct {
		i     int
		words []string
		name  string
	}{{int(c.OnInvalid), onInvalidWords, "OnInvalid"}, {int(c.SlotFailover), slotFailoverWords, "SlotFailover"}, {int(c.PgoutputBinary), pgoutputBinaryWords, "PgoutputBinary"}} {
		if e.i < 0 || e.i >= len(e.words) {
			return fmt.Errorf("outboxd: %s(%d) is not one of %q", e.name, e.i, e.words)
		}
	}
	return nil
}
