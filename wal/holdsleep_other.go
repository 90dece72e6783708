//go:build !linux

package wal

import "time"

// holdSleep is time.Sleep where the Linux build's raw nanosleep is not
// available (holdsleep_linux.go).
func holdSleep(d time.Duration) { time.Sleep(d) }
