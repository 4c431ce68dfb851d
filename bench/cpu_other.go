//go:build !unix

package main

import "time"

// processCPU is unknown (-1) where there is no getrusage.
func processCPU() time.Duration { return -1 }
