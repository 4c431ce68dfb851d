package netlock

import (
	"context"
	"fmt"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// SemaphoreInfo is what Semaphore.Inspect found in Redis.
type SemaphoreInfo struct {
	// Size is the size the semaphore's holders and waiters use, 0 when
	// nothing is held and nobody waits (the next to come sets it).
	Size int64
	// Out is the permits out, across every process: those the live leases
	// hold, and those a release set aside for waiters that are taking
	// them in.
	Out int64
	// Leases is the number of processes holding permits (live leases).
	Leases int
	// Waiters is the number of processes with a waiter in the queue.
	Waiters int
	// Holders are the live leases' holders (WithHolderInfo of each
	// process holding permits), in the order of their deadlines; "" for a
	// lease taken without one.
	Holders []string
}

// Inspect reads the semaphore's state in Redis, across every process using
// its name, in one read-only script bounded by the node timeout and ctx: it
// writes nothing and takes no place in the queue. Leases whose deadlines
// passed and waiters whose places were not renewed are not counted. Its
// errors match ErrQuorum and name the node, as Acquire's do.
func (s *Semaphore) Inspect(ctx context.Context) (SemaphoreInfo, error) {
	if s == nil || s.m == nil {
		return SemaphoreInfo{}, errZeroSemaphore
	}
	r := s.m.fanout(ctx, semInspectScript, s.keys, nil, nil)[0]
	var info SemaphoreInfo
	if r.err == nil {
		var ok bool
		if info, ok = readSemInspect(r.vals); !ok {
			r.err = nodeError(0, fmt.Errorf("sem_inspect script: unexpected reply %v", r.vals))
		}
	}
	if r.err != nil {
		return SemaphoreInfo{}, &quorumError{nodes: 1, need: 1, errs: []error{r.err}}
	}
	return info, nil
}

// readSemInspect reads lua/sem_inspect.lua's reply: four counts, then each
// live lease's holder, packed.
func readSemInspect(vals []int64) (SemaphoreInfo, bool) {
	if len(vals) < 4 {
		return SemaphoreInfo{}, false
	}
	info := SemaphoreInfo{Size: vals[0], Out: vals[1], Leases: int(vals[2]), Waiters: int(vals[3])}
	rest := vals[4:]
	for range info.Leases {
		h, next, ok := unpack(rest)
		if !ok {
			return SemaphoreInfo{}, false
		}
		info.Holders = append(info.Holders, keyspace.HolderDecode(h))
		rest = next
	}
	return info, len(rest) == 0
}
