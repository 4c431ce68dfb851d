//go:build unix

package main

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used, user and system, or -1
// if it cannot be had.
func processCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return -1
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
