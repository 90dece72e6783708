package sink

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/wal"
)

// Checkpoint says how far the events already committed to Kafka go. Events
// == 0: every transaction that committed before LSN (an end LSN) is in
// Kafka. Events > 0: a long PostgreSQL transaction was split over several
// Kafka transactions, and its first Events events (the transaction whose
// commit LSN is LSN) are in Kafka too.
type Checkpoint struct {
	LSN    wal.LSN
	Events int
}

// Covers reports whether event n (0-based) of the transaction committed at
// commit is in Kafka already.
func (c Checkpoint) Covers(commit wal.LSN, n int) bool {
	return commit < c.LSN || (c.Events > 0 && commit == c.LSN && n < c.Events)
}

// String is the record value: "X/Y", or "X/Y+N" for a split transaction.
func (c Checkpoint) String() string {
	if c.Events == 0 {
		return c.LSN.String()
	}
	return fmt.Sprintf("%s+%d", c.LSN, c.Events)
}

// ParseCheckpoint reads a checkpoint record's value.
func ParseCheckpoint(text string) (Checkpoint, error) {
	lsn, n, split := strings.Cut(text, "+")
	var c Checkpoint
	var err error
	if c.LSN, err = wal.ParseLSN(lsn); err != nil {
		return Checkpoint{}, err
	}
	if split {
		if c.Events, err = strconv.Atoi(n); err != nil || c.Events < 1 {
			return Checkpoint{}, fmt.Errorf("bad event count in checkpoint %q", text)
		}
	}
	return c, nil
}
