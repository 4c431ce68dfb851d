//go:build unix

package main

import (
	"errors"
	"os"
	"syscall"
)

// sysProcAttr returns how "netlock run" starts the program: in a process
// group of its own when ownGroup is set, so that a signal netlock passes on
// reaches everything the program started (a script's commands too), not its
// first process only; and, where the system can, with SIGTERM sent to it
// should netlock die without releasing the lock.
func sysProcAttr(ownGroup bool) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: ownGroup}
	setDeathSignal(attr)
	return attr
}

// signalProgram sends sig to p, and to its whole process group if it has
// its own. A program that has already exited is not an error.
func signalProgram(p *os.Process, ownGroup bool, sig syscall.Signal) error {
	var err error
	if ownGroup {
		err = syscall.Kill(-p.Pid, sig)
	} else {
		err = p.Signal(sig)
	}
	if errors.Is(err, syscall.ESRCH) || errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// hasTerminal reports whether netlock has a controlling terminal. A program
// started in a process group of its own there would be stopped (SIGTTIN) as
// soon as it read from the terminal, so it stays in netlock's.
func hasTerminal() bool {
	f, err := os.Open("/dev/tty")
	if err != nil {
		return false
	}
	f.Close()
	return true
}
