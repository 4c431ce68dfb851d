//go:build !unix

package redistest

import (
	"syscall"
	"time"
)

// Pause and Resume need job-control signals, which this platform lacks;
// sending these fails with an error.
const (
	sigStop = syscall.Signal(-1)
	sigCont = syscall.Signal(-2)
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func waitStopped(int, time.Duration) {}
