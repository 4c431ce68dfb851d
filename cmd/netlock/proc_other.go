//go:build !unix

package main

import (
	"errors"
	"os"
	"syscall"
)

// sysProcAttr: without Unix process groups, the program is started plainly.
func sysProcAttr(bool) *syscall.SysProcAttr { return nil }

// signalProgram sends sig to p; a platform without Unix signals can only kill.
func signalProgram(p *os.Process, _ bool, sig syscall.Signal) error {
	err := p.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// hasTerminal reports false: there are no process groups to keep the
// program out of.
func hasTerminal() bool { return false }
