package main

import (
	"os"
	"syscall"
)

// dieWithParent asks the kernel for SIGTERM when the parent process exits
// (PR_SET_PDEATHSIG), and exits at once if it already has.
func dieWithParent() {
	ppid := os.Getppid()
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0)
	if os.Getppid() != ppid { // the parent died before the request took
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
}
