package main

import "syscall"

// The exit codes of netlock's commands, besides the program's own for
// "netlock run". 64, 69 and 75 are sysexits.h's EX_USAGE, EX_UNAVAILABLE
// and EX_TEMPFAIL: codes that programs rarely exit with, so that a script
// can tell netlock's own from its program's.
const (
	exitOK   = 0 // done
	exitFree = 0 // status: the lock is free

	exitConflict = 1 // run: the lock is held elsewhere (the default of --conflict-exit-code, as flock -n)
	exitHeld     = 1 // status: the lock is held
	exitNoLeader = 1 // leader: nobody leads the election
	exitFailed   = 1 // demo: the locked phase lost updates; run: the program's status could not be learned

	exitUsage       = 64  // a bad flag, argument or lock name; nothing was done (EX_USAGE)
	exitUnavailable = 69  // Redis could not be asked, or refused what netlock asked (EX_UNAVAILABLE)
	exitLost        = 75  // run: the hold was lost while the program ran (EX_TEMPFAIL)
	exitNoExec      = 126 // run: the program was found but could not be started
	exitNotFound    = 127 // run: the program was not found
)

// exitSignal is the exit code for signal sig, as a shell reports a process
// that sig killed: 128+N.
func exitSignal(sig syscall.Signal) int { return 128 + int(sig) }

// exitInterrupted is the code of a command stopped before it was done: the
// demo on SIGINT or SIGTERM, or a command whose context an in-process
// caller ended. 128+SIGINT, as a shell reports Ctrl-C.
var exitInterrupted = exitSignal(syscall.SIGINT)
