package main

import "syscall"

// setDeathSignal has the kernel send SIGTERM to the program if netlock dies
// first (say, by SIGKILL): the lock is then no longer extended and expires,
// and the program must not go on as if it held it.
func setDeathSignal(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGTERM }
