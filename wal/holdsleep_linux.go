package wal

import (
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// holdSleep is the coalescer's wait while a backlog drains: a nanosleep
// made without telling the Go scheduler, so the reading goroutine keeps its
// P through the wait. With time.Sleep every wait parks the goroutine, the
// runtime often finds every P idle, and its monitor thread (sysmon) goes to
// sleep until the next syscall, which wakes it and resets it to polling
// every 20 µs: every wait of a drain restarted that polling, and in
// sched_switch profiles of drains sysmon's sleeps were a large share of
// outboxd's context switches. Held this way the P never looks idle during
// a wait, so sysmon backs off to its 10 ms naps.
//
// The cost is that the P does nothing else for the wait (at most
// coalesceMaxWait): the other goroutines (the producer's, the acks') run on
// the other Ps. With a single P they would all wait, so then it is
// time.Sleep. A signal ends the wait early (EINTR): the runtime preempts
// with SIGURG, and a stop-the-world (a garbage collection's) then finds the
// goroutine at its next safe point instead of up to a wait later.
func holdSleep(d time.Duration) {
	if runtime.GOMAXPROCS(0) < 2 {
		time.Sleep(d)
		return
	}
	ts := unix.NsecToTimespec(int64(d))
	unix.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}
