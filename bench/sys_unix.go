//go:build unix && !linux

package main

import "syscall"

// serverSysProcAttr puts redis-server in its own process group.
func serverSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
