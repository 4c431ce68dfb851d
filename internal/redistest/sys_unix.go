//go:build unix && !linux

package redistest

import (
	"syscall"
	"time"
)

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

// waitStopped gives the kernel a moment to stop the process.
func waitStopped(int, time.Duration) { time.Sleep(10 * time.Millisecond) }
