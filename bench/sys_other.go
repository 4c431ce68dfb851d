//go:build !unix

package main

import "syscall"

// serverSysProcAttr has nothing to add where there are no process groups.
func serverSysProcAttr() *syscall.SysProcAttr { return nil }
