package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/netlock-go/netlock"
)

// The Semaphore scenarios: permits of one Semaphore shared by processes
// (sem4), against the same workload on semSize NetMutex names; and the
// waiting cost of a full Semaphore (semwaiting40).
const (
	semProcesses  = 8 // clients, each its own connections, as processes
	semGoroutines = 4 // goroutines per process, sharing its lock objects
	semSize       = 4 // the Semaphore's size; as many NetMutex names
)

var (
	semID        = fmt.Sprintf("sem%d", semSize)
	semWaitingID = fmt.Sprintf("semwaiting%d", waitingClients)
)

// A semStats is what rows of the sem4 scenario measure besides a result's:
// the result's ops are the acquisitions, its lat the acquire waits (from
// Acquire called to its return), its perWorker the acquisitions per
// process.
type semStats struct {
	perGoroutine []int64
	commands     int64 // as rwResult's: INFO commandstats, PINGs and bench's INFO left out
	scripts      int64
}

func (a *semStats) add(b *semStats) {
	if len(a.perGoroutine) < len(b.perGoroutine) {
		a.perGoroutine = append(a.perGoroutine, make([]int64, len(b.perGoroutine)-len(a.perGoroutine))...)
	}
	for i, n := range b.perGoroutine {
		a.perGoroutine[i] += n
	}
	a.commands += b.commands
	a.scripts += b.scripts
}

// jain is Jain's fairness index of xs: 1 when all are equal, 1/len(xs) when
// one has everything.
func jain(xs []int64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// A semSlot is what one goroutine of the sem4 scenario takes and gives back:
// a permit of the process's Semaphore, or the lock of one of the process's
// NetMutexes.
type semSlot interface {
	take(ctx context.Context) error
	give() error
}

type semPermit struct{ s *netlock.Semaphore }

func (p semPermit) take(ctx context.Context) error { return p.s.Acquire(ctx, 1) }
func (p semPermit) give() error                    { return p.s.ReleaseCtx(context.Background(), 1) }

type mutexSlot struct{ m *netlock.NetMutex }

func (l mutexSlot) take(ctx context.Context) error { return l.m.LockCtx(ctx) }
func (l mutexSlot) give() error                    { return l.m.UnlockCtx(context.Background()) }

// semRows are the rows of the sem4 scenario for one netlock contender.
func semRows(c *contender, addr string) []*row {
	return []*row{
		semRow(c, addr, "Semaphore", fmt.Sprintf("one *Semaphore (size %d) per process, shared by its %d goroutines; Acquire(ctx, 1) … Release(1)", semSize, semGoroutines),
			func(name string, b []netlock.Backend) ([]semSlot, error) {
				s, err := netlock.NewSemaphore(name, semSize, b)
				if err != nil {
					return nil, err
				}
				slots := make([]semSlot, semGoroutines)
				for g := range slots {
					slots[g] = semPermit{s}
				}
				return slots, nil
			}),
		semRow(c, addr, fmt.Sprintf("NetMutex×%d", semSize), fmt.Sprintf("%d names, one *NetMutex per name per process; goroutine g of each process locks name g mod %d, so %d processes contend for each name", semSize, semSize, semProcesses),
			func(name string, b []netlock.Backend) ([]semSlot, error) {
				ms := make([]semSlot, semSize)
				for k := range ms {
					m, err := netlock.New(fmt.Sprintf("%s:%d", name, k), b)
					if err != nil {
						return nil, err
					}
					ms[k] = mutexSlot{m}
				}
				slots := make([]semSlot, semGoroutines)
				for g := range slots {
					slots[g] = ms[g%semSize]
				}
				return slots, nil
			}),
	}
}

func semRow(c *contender, addr, kind, note string, newSlots func(name string, b []netlock.Backend) ([]semSlot, error)) *row {
	name := rwRowName(kind, c.name)
	return &row{name: name, c: c, note: note, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		probe, cls, cleanup, err := probeAndConnect(c, addr, semProcesses)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, dur time.Duration, round int) result {
			var res result
			lname := lockName(semID, name, round, 0)
			var slots [][]semSlot // [process][goroutine]
			for _, cl := range cls {
				nc, ok := cl.(*netlockClient)
				if !ok {
					res.addErr(fmt.Errorf("%s is not netlock", c.name))
					return res
				}
				s, err := newSlots(lname, nc.backends)
				if err != nil {
					res.addErr(err)
					return res
				}
				slots = append(slots, s)
			}
			before, err := readCommandStats(probe)
			if err != nil {
				res.addErr(err)
				return res
			}
			res = runSem(ctx, dur, slots, kind == "Semaphore")
			after, err := readCommandStats(probe)
			if err != nil {
				res.addErr(err)
			} else {
				n, _ := after.since(before)
				delta := func(cmd string) int64 { return after.calls[cmd] - before.calls[cmd] }
				res.sem.commands = n - delta("ping")
				res.sem.scripts = delta("evalsha") + delta("eval")
			}
			if res.overlaps > 0 {
				res.addErr(fmt.Errorf("EXCLUSION VIOLATED: %d sections found more holders inside than permits", res.overlaps))
			}
			return res
		}, cleanup, nil
	}}
}

// runSem has goroutine g of process p loop on slots[p][g] for dur: take, a
// critical section (rwSection), give back. A counter of the holders inside
// catches more than semSize in at once (one Semaphore), or two on one name
// (NetMutex rows: a counter per name); each such section counts as an
// overlap. Only sections whose acquire returned before the deadline count.
func runSem(ctx context.Context, dur time.Duration, slots [][]semSlot, oneSem bool) result {
	rctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	deadline := time.Now().Add(dur)
	var inside [semSize]atomic.Int64
	var overlaps atomic.Int64
	limit := int64(1)
	if oneSem {
		limit = semSize
	}
	parts := make([]result, semProcesses*semGoroutines)
	var wg sync.WaitGroup
	for p, ps := range slots {
		for g, slot := range ps {
			counter := &inside[0]
			if !oneSem {
				counter = &inside[g%semSize]
			}
			wg.Go(func() {
				r := &parts[p*semGoroutines+g]
				lat := make([]int64, 0, 4096)
				for rctx.Err() == nil {
					t0 := time.Now()
					err := slot.take(rctx)
					t1 := time.Now()
					if err != nil {
						if r.failed(rctx, deadline, err) {
							break
						}
						continue
					}
					ok := counter.Add(1) <= limit
					section(rwSection)
					counter.Add(-1)
					if !ok {
						overlaps.Add(1)
					}
					r.addIfErr(slot.give())
					if t1.After(deadline) {
						break
					}
					r.ops++
					lat = append(lat, t1.Sub(t0).Nanoseconds())
				}
				r.lat = lat
			})
		}
	}
	wg.Wait()
	total := result{sem: &semStats{perGoroutine: make([]int64, len(parts))}, perWorker: make([]int64, semProcesses)}
	for i, part := range parts {
		total.sem.perGoroutine[i] = part.ops
		total.perWorker[i/semGoroutines] += part.ops
		part.perWorker = nil
		total.merge(part)
	}
	total.elapsed = dur
	total.overlaps = overlaps.Load()
	return total
}

func writeSemTable(p printer, sc *scenario) {
	p("| contender | acquisitions/s | × NetMutex×%d's | acquire wait p50 | p99 | per process min/max | Jain's index, processes | goroutines | commands per acquisition | scripts per acquisition | gave up | errors | overlaps | notes |\n", semSize)
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range sc.rows {
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | | | | | | | | | | | | %s |\n", r.name, status, r.na)
			continue
		}
		res := &r.res
		if res.sem == nil {
			p("| %s | not measured (see Errors) | | | | | | | | | %d | %d | %d | %s |\n", rowName(r), res.busy, res.errs, res.overlaps, r.note)
			continue
		}
		rate := fmtRate(res.rate())
		if res.overlaps > 0 {
			rate = "**FAILED: more holders than permits** (" + rate + ")"
		}
		ratio := "–"
		if b := semBase(sc, r); b != nil && b.res.rate() > 0 {
			ratio = fmt.Sprintf("%.2f×", res.rate()/b.res.rate())
		}
		lo, hi := slices.Min(res.perWorker), slices.Max(res.perWorker)
		per := func(n int64) string {
			if res.ops == 0 {
				return "–"
			}
			return fmtRate(float64(n) / float64(res.ops))
		}
		p("| %s | %s | %s | %s | %s | %d/%d | %.3f | %.3f | %s | %s | %d | %d | %d | %s |\n", rowName(r), rate, ratio,
			fmtPct(res, 0.50), fmtPct(res, 0.99), lo, hi, jain(res.perWorker), jain(res.sem.perGoroutine),
			per(res.sem.commands), per(res.sem.scripts), res.busy, res.errs, res.overlaps, r.note)
	}
}

// semBase is the NetMutex×4 row of a Semaphore row (same client), nil if
// there is none or it has no figures.
func semBase(sc *scenario, r *row) *row {
	for _, b := range sc.rows {
		if b.c == r.c && b != r && b.name == rwRowName(fmt.Sprintf("NetMutex×%d", semSize), r.c.name) {
			if _, ok := rowStatus(b); ok {
				return b
			}
		}
	}
	return nil
}

// The waiting cost of a full Semaphore.

// semLocker is a Semaphore as a locker of the waiting scenario: the holder
// takes every permit (a writer, for the guard), a waiter one (a reader:
// waiters may be in together, never with the holder).
type semLocker struct {
	s *netlock.Semaphore
	n int64
}

func (l semLocker) reads() bool { return l.n < semSize }

func (l semLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	if err := l.s.Acquire(ctx, l.n); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return l.s.ReleaseCtx(ctx, l.n) }, nil
}

// semWaitingRow: a holder of every permit and waitingClients waiters of one
// permit each, for one netlock contender.
func semWaitingRow(c *contender, addr string) *row {
	name := rwRowName("Semaphore", c.name)
	lname := lockName(semWaitingID, name, 0, 0)
	return &row{name: name, c: c,
		note: fmt.Sprintf("size %d; the holder Acquires %d, each of the %d waiters Acquire(ctx, 1); the holder's watchdog extends its lease", semSize, semSize, waitingClients),
		setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
			return func(ctx context.Context, window time.Duration, _ int) result {
				return runWaiting(ctx, c, addr, window, func(cls []client) (locker, []locker, error) {
					lockers := make([]locker, len(cls))
					for i, cl := range cls {
						nc, ok := cl.(*netlockClient)
						if !ok {
							return nil, nil, fmt.Errorf("%s is not netlock", c.name)
						}
						s, err := netlock.NewSemaphore(lname, semSize, nc.backends)
						if err != nil {
							return nil, nil, err
						}
						n := int64(1)
						if i == 0 {
							n = semSize
						}
						lockers[i] = semLocker{s: s, n: n}
					}
					return lockers[0], lockers[1:], nil
				})
			}, func() {}, nil
		}}
}
