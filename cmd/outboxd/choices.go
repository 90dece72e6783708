package main

import (
	"encoding"

	"github.com/outboxd/outboxd"
)

// engineChoices parses the flags that choose among the engine's typed
// options (--on-invalid, --slot-failover, --pgoutput-binary) into cfg: the
// flags keep their words, the engine takes its constants.
func engineChoices(o runOptions, cfg *outboxd.Config) error {
	for _, c := range []struct {
		word string
		into encoding.TextUnmarshaler
	}{{o.OnInvalid, &cfg.OnInvalid}, {o.SlotFailover, &cfg.SlotFailover}, {o.PgoutputBinary, &cfg.PgoutputBinary}} {
		if err := c.into.UnmarshalText([]byte(c.word)); err != nil {
			return err
		}
	}
	return nil
}
