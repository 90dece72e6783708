package e2e

import "syscall"

const syscallSIGTERM = syscall.SIGTERM
