package main

import "syscall"

// serverSysProcAttr puts redis-server in its own process group and has the
// kernel kill it if this process dies without stopping it.
func serverSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
