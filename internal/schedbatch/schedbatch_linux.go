//go:build linux

package schedbatch

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxPasses bounds Set's passes over the threads: a thread the runtime
// starts while a pass runs may be cloned from one the pass has not reached
// yet, so Set goes over them again until a pass finds nothing to change.
const maxPasses = 8

// Set moves every thread of the process that runs under the default policy
// (SCHED_OTHER) to SCHED_BATCH, keeping its nice value. A thread under
// another policy keeps it: whoever started the process chose it.
func Set() (Result, error) {
	var r Result
	for range maxPasses {
		tids, err := threads()
		if err != nil {
			return r, err
		}
		changed, kept := 0, 0
		for _, tid := range tids {
			a, err := unix.SchedGetAttr(tid, 0)
			if errors.Is(err, unix.ESRCH) {
				continue // the thread ended
			}
			if err != nil {
				return r, fmt.Errorf("sched_getattr(%d): %w", tid, err)
			}
			switch a.Policy {
			case unix.SCHED_BATCH:
				continue
			case unix.SCHED_NORMAL:
			default:
				kept++
				continue
			}
			// Keep the nice value (a.Nice); drop utilization clamps and
			// reset-on-fork, which would make the threads the runtime
			// clones later start under the default policy again.
			a.Policy, a.Flags = unix.SCHED_BATCH, 0
			a.Util_min, a.Util_max = 0, 0
			err = unix.SchedSetAttr(tid, a, 0)
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			if err != nil {
				return r, fmt.Errorf("sched_setattr(%d, SCHED_BATCH): %w", tid, err)
			}
			changed++
		}
		r.Threads += changed
		r.Kept = kept
		if changed == 0 {
			return r, nil
		}
	}
	return r, nil
}

// threads lists the process's thread ids.
func threads() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
