// Package schedbatch runs the process under Linux's SCHED_BATCH scheduling
// policy.
//
// outboxd is the second stage of a two-process pipeline: the walsender
// decodes the WAL and writes it to the replication socket, outboxd reads,
// routes and sends it on. Under the default policy (SCHED_OTHER) each
// arrival of data wakes an outboxd thread with a claim to preempt whatever
// runs on that core, often the walsender itself on a small machine. The
// two then take turns: outboxd reads a little, sends it, sleeps and is
// woken again, and every turn costs context switches on both sides. A
// SCHED_BATCH thread is presumed to be throughput-bound: woken, it does not
// preempt the running task but waits until that task blocks or its slice
// runs out (a few milliseconds at most); by then more has arrived, so each
// wake-up reads and sends more. On an idle core it runs at once, so a
// lone event is not held back; the wait applies only where every core is
// busy. Its nice value and its share of the CPU are unchanged.
//
// outboxd run asks for it only while a backlog drains (the replication
// stream stays busy) and goes back to the default policy when the stream
// goes quiet: at ordinary rates, on a busy machine, an event is read the
// moment it arrives, as before.
//
// The policy belongs to each thread. Set and Reset change every thread of
// the process; the threads the Go runtime starts later are cloned from
// these and inherit it.
package schedbatch

import "fmt"

// Result is what Set or Reset did.
type Result struct {
	// Threads is how many threads it moved.
	Threads int
	// Kept is how many threads it left under a policy someone chose (a
	// real-time or idle one, say from chrt): it changes only SCHED_NORMAL
	// and SCHED_BATCH.
	Kept int
}

func (r Result) String() string {
	s := fmt.Sprintf("%d threads", r.Threads)
	if r.Kept > 0 {
		s += fmt.Sprintf(", %d kept under the policy they were started with", r.Kept)
	}
	return s
}
