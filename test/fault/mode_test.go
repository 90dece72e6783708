package fault

import (
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// deliveryMode is everything the suite varies between outboxd's delivery
// guarantees. Adding a mode is adding an entry to modes; select it with
// -mode NAME.
type deliveryMode struct {
	name string
	// outboxdArgs are appended to every outboxd command line.
	outboxdArgs []string
	// isolation is what the checker's consumer and the invariant monitor use.
	// With read_committed the monitor compares against the last stable offset
	// (kadm ListCommittedOffsets) instead of the high watermark.
	isolation kgo.IsolationLevel
	// transactional: records are written in Kafka transactions, so offsets
	// include control records and end offsets are not record counts.
	transactional bool
	// maxDuplicates is the number of duplicate deliveries (same id header
	// seen more than once) the checker tolerates; -1 means any.
	maxDuplicates int
	// up tells from /status that a freshly started outboxd is up (nil:
	// streaming). In exactly-once mode, outboxd waits for Kafka before it
	// streams (it needs the checkpoint to know where to start), so while
	// the broker is down, waiting for Kafka is the expected state.
	up func(st map[string]any) bool
}

var modes = map[string]deliveryMode{
	"at-least-once": {
		name:          "at-least-once",
		isolation:     kgo.ReadUncommitted(),
		maxDuplicates: -1,
	},
	// Transactional producer, read_committed consumers, no duplicates
	// whatever the faults.
	"exactly-once": {
		name:          "exactly-once",
		outboxdArgs:   []string{"--exactly-once"},
		isolation:     kgo.ReadCommitted(),
		transactional: true,
		maxDuplicates: 0,
		up:            func(st map[string]any) bool { return harness.Streaming(st) || st["waiting_for_kafka"] == true },
	},
}

func lookupMode(name string) (deliveryMode, error) {
	m, ok := modes[name]
	if !ok {
		var names []string
		for n := range modes {
			names = append(names, n)
		}
		sort.Strings(names)
		return deliveryMode{}, fmt.Errorf("unknown -mode %q (known: %s)", name, strings.Join(names, ", "))
	}
	return m, nil
}

func (m deliveryMode) readCommitted() bool { return m.isolation == kgo.ReadCommitted() }
