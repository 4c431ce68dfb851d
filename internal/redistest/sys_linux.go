//go:build linux

package redistest

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

// sysProcAttr makes the kernel kill the server if the test binary dies
// without running its cleanups (for example on a test timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits up to timeout until process pid is in the stopped state,
// so that a paused server cannot answer a command sent right after Pause.
func waitStopped(pid int, timeout time.Duration) {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(path)
		if err != nil {
			return
		}
		// The state follows the parenthesised command name: "pid (comm) S ...".
		if i := bytes.LastIndexByte(data, ')'); i >= 0 && i+2 < len(data) {
			if st := data[i+2]; st == 'T' || st == 't' {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
}
