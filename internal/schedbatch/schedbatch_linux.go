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
// (SCHED_NORMAL) to SCHED_BATCH, keeping its nice value. A thread under
// another policy keeps it: whoever started the process chose it.
func Set() (Result, error) { return move(unix.SCHED_NORMAL, unix.SCHED_BATCH) }

// Reset moves every SCHED_BATCH thread back to the default policy.
func Reset() (Result, error) { return move(unix.SCHED_BATCH, unix.SCHED_NORMAL) }

// Default reports whether the calling thread runs under the default policy:
// false when whoever started the process chose another (chrt), which Set
// and Reset would then override for the threads under SCHED_NORMAL or
// SCHED_BATCH.
func Default() (bool, error) {
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return false, fmt.Errorf("sched_getattr: %w", err)
	}
	return a.Policy == unix.SCHED_NORMAL, nil
}

// move puts every thread under policy from under policy to.
func move(from, to uint32) (Result, error) {
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
			case to:
				continue
			case from:
			default:
				kept++
				continue
			}
			// Keep the nice value (a.Nice); drop utilization clamps and
			// reset-on-fork, which would make the threads the runtime
			// clones later start under the default policy again.
			a.Policy, a.Flags = to, 0
			a.Util_min, a.Util_max = 0, 0
			err = unix.SchedSetAttr(tid, a, 0)
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			if err != nil {
				return r, fmt.Errorf("sched_setattr(%d, %s): %w", tid, policyName(to), err)
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

func policyName(p uint32) string {
	switch p {
	case unix.SCHED_NORMAL:
		return "SCHED_NORMAL"
	case unix.SCHED_BATCH:
		return "SCHED_BATCH"
	}
	return strconv.Itoa(int(p))
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
