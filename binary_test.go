package outboxd

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

// TestBinaryFallback: a session that ended at a relation the router does
// not render from binary makes every later session stream text, and
// PgoutputBinaryOff never asks for binary.
func TestBinaryFallback(t *testing.T) {
	r := &relay{cfg: Config{PgoutputBinary: PgoutputBinaryAuto}, log: slog.New(slog.DiscardHandler)}
	if r.binaryTypes() == nil {
		t.Fatal("auto: no binary predicate")
	}
	if r.binaryEnded(errors.New("replication stream: EOF")) || r.binaryTypes() == nil {
		t.Fatal("another error switched to text")
	}
	if !r.binaryEnded(fmt.Errorf("pgoutput: %w: column x", wal.ErrBinaryUnsupported)) || r.binaryTypes() != nil {
		t.Fatal("ErrBinaryUnsupported did not switch to text")
	}
	off := &relay{cfg: Config{PgoutputBinary: PgoutputBinaryOff}}
	if off.binaryTypes() != nil {
		t.Fatal("off: binary predicate")
	}
}
