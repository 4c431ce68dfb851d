package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/netlock-go/netlock"
)

// The NetRWMutex scenarios: a read-mostly workload (rwread), NetRWMutex
// against NetMutex taken for reads and writes alike, and the waiting cost of
// NetRWMutex's readers and writers (rwwaiting40).
const (
	rwProcesses  = 8   // clients, each its own connections, as processes
	rwGoroutines = 4   // goroutines per process, sharing its lock object
	rwReadShare  = 0.9 // the share of sections that read
	// rwSleepFrom is the shortest critical section that sleeps; shorter
	// ones busy-wait (see section).
	rwSleepFrom = time.Millisecond
)

// rwSection is the critical section of the read-mostly scenario, reading or
// writing (-rwsection).
var rwSection = 20 * time.Microsecond

// rwTarget returns the goal for reads/s of NetRWMutex ÷ NetMutex's at
// rwSection: never slower than the NetMutex where a round trip costs more
// than a section (a process serves its own readers and writers under its
// write lock, as a NetMutex serves its goroutines), and 4× from 1 ms
// sections, where readers of every process read together.
func rwTarget() float64 {
	if rwSection >= time.Millisecond {
		return 4.0
	}
	return 1.0
}

const rwReadID = "rwread"

var rwWaitingID = fmt.Sprintf("rwwaiting%d", waitingClients)

// An rwResult is what rows of the read-mostly scenario measure besides a
// result's: the reads and writes apart, and what they cost Redis. The
// result's ops count reads and writes together; its lat holds the reads'
// acquire latencies.
type rwResult struct {
	reads, writes int64
	writeLat      []int64 // ns from LockCtx called to LockCtx returned
	// commands Redis ran while the row ran (INFO commandstats, the commands
	// scripts call included), the client library's keepalive PINGs and the
	// measuring connection's INFO left out.
	commands int64
	scripts  int64 // EVALSHA and EVAL calls among them: the round trips that run a script
}

func (a *rwResult) add(b *rwResult) {
	a.reads += b.reads
	a.writes += b.writes
	a.writeLat = append(a.writeLat, b.writeLat...)
	a.commands += b.commands
	a.scripts += b.scripts
}

// perOp is n per section, read or written.
func (a *rwResult) perOp(n int64) string {
	if a.reads+a.writes == 0 {
		return "–"
	}
	return fmtRate(float64(n) / float64(a.reads+a.writes))
}

func (r *result) readRate() float64  { return r.rwRate(func(a *rwResult) int64 { return a.reads }) }
func (r *result) writeRate() float64 { return r.rwRate(func(a *rwResult) int64 { return a.writes }) }

func (r *result) rwRate(n func(*rwResult) int64) float64 {
	if r.rw == nil || r.elapsed <= 0 {
		return 0
	}
	return float64(n(r.rw)) / r.elapsed.Seconds()
}

// writePct is the q-quantile of the write acquire latencies.
func (r *result) writePct(q float64) string {
	if r.rw == nil {
		return "–"
	}
	w := result{lat: r.rw.writeLat}
	return fmtPct(&w, q)
}

// An rwLocker is one process's lock object in the read-mostly scenario,
// shared by its goroutines.
type rwLocker interface {
	lock(ctx context.Context) (unlock func(context.Context) error, err error)
	rlock(ctx context.Context) (unlock func(context.Context) error, err error)
}

// netRW is a NetRWMutex: RLockCtx to read, LockCtx to write.
type netRW struct{ m *netlock.NetRWMutex }

func (l netRW) lock(ctx context.Context) (func(context.Context) error, error) {
	if err := l.m.LockCtx(ctx); err != nil {
		return nil, err
	}
	return l.m.UnlockCtx, nil
}

func (l netRW) rlock(ctx context.Context) (func(context.Context) error, error) {
	if err := l.m.RLockCtx(ctx); err != nil {
		return nil, err
	}
	return l.m.RUnlockCtx, nil
}

// netRWMutex is a NetMutex taken with LockCtx to read and to write alike.
type netRWMutex struct{ netlockLocker }

func (l netRWMutex) rlock(ctx context.Context) (func(context.Context) error, error) {
	return l.lock(ctx)
}

// rwReadRows are the rows of the read-mostly scenario for one netlock
// contender: NetRWMutex, and NetMutex for both kinds of section.
func rwReadRows(c *contender, addr string) []*row {
	return []*row{
		rwReadRow(c, addr, "NetRWMutex", "RLockCtx to read, LockCtx to write; one *NetRWMutex per process", func(name string, b []netlock.Backend) (rwLocker, error) {
			m, err := netlock.NewRW(name, b)
			return netRW{m}, err
		}),
		rwReadRow(c, addr, "NetMutex", "LockCtx to read and to write; one *NetMutex per process", func(name string, b []netlock.Backend) (rwLocker, error) {
			m, err := netlock.New(name, b)
			return netRWMutex{netlockLocker{m}}, err
		}),
	}
}

// probeAndConnect dials a probe connection (for INFO commandstats) and n
// clients of c to addr, as n processes would have; cleanup closes them all.
func probeAndConnect(c *contender, addr string, n int) (probe redis.Conn, cls []client, cleanup func(), err error) {
	probe, err = dialProbe(addr)
	if err != nil {
		return nil, nil, nil, err
	}
	cls, closeAll, err := connectN(c, []string{addr}, n)
	if err != nil {
		probe.Close()
		return nil, nil, nil, err
	}
	return probe, cls, func() { closeAll(); probe.Close() }, nil
}

// rwRowName names a row of the NetRWMutex scenarios: the lock type (kind),
// then the client library of netlock contender nl.
func rwRowName(kind, nl string) string { return kind + "/" + clientOf(nl) }

func rwReadRow(c *contender, addr, kind, note string, newLock func(name string, b []netlock.Backend) (rwLocker, error)) *row {
	name := rwRowName(kind, c.name)
	return &row{name: name, c: c, note: note, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		probe, cls, cleanup, err := probeAndConnect(c, addr, rwProcesses)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, dur time.Duration, round int) result {
			var res result
			lname := lockName(rwReadID, name, round, 0)
			workers := make([]rwLocker, 0, rwProcesses*rwGoroutines)
			for _, cl := range cls {
				nc, ok := cl.(*netlockClient)
				if !ok {
					res.addErr(fmt.Errorf("%s is not netlock", c.name))
					return res
				}
				l, err := newLock(lname, nc.backends)
				if err != nil {
					res.addErr(err)
					return res
				}
				for range rwGoroutines {
					workers = append(workers, l)
				}
			}
			before, err := readCommandStats(probe)
			if err != nil {
				res.addErr(err)
				return res
			}
			res = runRWRead(ctx, dur, workers, uint64(round+2))
			after, err := readCommandStats(probe)
			if err != nil {
				res.addErr(err)
			} else {
				n, _ := after.since(before)
				delta := func(cmd string) int64 { return after.calls[cmd] - before.calls[cmd] }
				res.rw.commands = n - delta("ping")
				res.rw.scripts = delta("evalsha") + delta("eval")
			}
			if res.overlaps > 0 || res.lost > 0 {
				res.addErr(fmt.Errorf("EXCLUSION VIOLATED: %d sections found someone inside they must exclude, %d writes lost", res.overlaps, res.lost))
			}
			return res
		}, cleanup, nil
	}}
}

// runRWRead has worker i loop on workers[i] for dur (several workers share
// one process's object): with probability rwReadShare a read section (rlock,
// rwSection, unlock), else a write section (lock, rwSection, unlock). A guard
// counts who is inside: a section that finds someone it must exclude (a
// writer with anyone else) is an overlap, when it enters or before it
// leaves; a write also increments a counter with a separate load and store
// around its section, so writes inside together lose updates. Only sections
// whose acquire returned before the deadline count; latencies are from the
// acquire called to its return. The choice of each section comes from a
// generator seeded by seed and the worker, the same for every row.
func runRWRead(ctx context.Context, dur time.Duration, workers []rwLocker, seed uint64) result {
	rctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	deadline := time.Now().Add(dur)
	var (
		g        guard
		counter  atomic.Int64
		written  atomic.Int64 // writes done, counted or not
		overlaps atomic.Int64
	)
	parts := make([]result, len(workers))
	rws := make([]rwResult, len(workers))
	var wg sync.WaitGroup
	for i, l := range workers {
		wg.Go(func() {
			r, a := &parts[i], &rws[i]
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			lat := make([]int64, 0, 4096)
			for rctx.Err() == nil {
				read := rng.Float64() < rwReadShare
				get := l.lock
				if read {
					get = l.rlock
				}
				t0 := time.Now()
				unlock, err := get(rctx)
				t1 := time.Now()
				if err != nil {
					if r.failed(rctx, deadline, err) {
						break
					}
					continue
				}

				ok := g.enter(read)
				var seq int64
				if !read {
					seq = counter.Load()
				}
				section(rwSection)
				if !read {
					counter.Store(seq + 1)
					written.Add(1)
				}
				if !g.still(read) {
					ok = false
				}
				g.leave(read)
				if !ok {
					overlaps.Add(1)
				}

				// Not rctx: a hold taken just before the deadline is still released.
				r.addIfErr(unlock(context.Background()))
				if t1.After(deadline) {
					break
				}
				r.ops++
				if read {
					a.reads++
					lat = append(lat, t1.Sub(t0).Nanoseconds())
				} else {
					a.writes++
					a.writeLat = append(a.writeLat, t1.Sub(t0).Nanoseconds())
				}
			}
			r.lat = lat
		})
	}
	wg.Wait()
	total := result{rw: &rwResult{}}
	for i, p := range parts {
		total.merge(p)
		total.rw.add(&rws[i])
	}
	total.elapsed = dur
	total.overlaps = overlaps.Load()
	total.lost = written.Load() - counter.Load()
	return total
}

// section spends d inside a critical section: a busy wait on the clock
// below rwSleepFrom, else a sleep. Not a sleep for short ones: on Linux,
// time.Sleep of tens of µs lasts about a millisecond while the process has
// nothing else to run (its timers wait in the network poller, in
// milliseconds). Not a busy wait for long ones: readers inside together
// would compete for the CPU, which the clients and servers need.
func section(d time.Duration) {
	if d >= rwSleepFrom {
		time.Sleep(d)
		return
	}
	for t := time.Now(); time.Since(t) < d; {
	}
}

// sectionHow says what section does for d, for the report.
func sectionHow(d time.Duration) string {
	if d >= rwSleepFrom {
		return fmt.Sprintf("a %v sleep", d)
	}
	return fmt.Sprintf("a %v busy wait (not a sleep: on Linux a sleep that short lasts about a millisecond)", d)
}

// rwBase is the NetMutex row of a NetRWMutex row (same client), nil if
// there is none or it has no figures.
func rwBase(sc *scenario, r *row) *row {
	for _, b := range sc.rows {
		if b.c == r.c && b != r && b.name == rwRowName("NetMutex", r.c.name) {
			if _, ok := rowStatus(b); ok {
				return b
			}
		}
	}
	return nil
}

func writeRWTable(p printer, sc *scenario) {
	p("| contender | reads/s | writes/s | reads/s ÷ NetMutex's | read acquire p50 | p99 | write acquire p50 | p99 | commands per section | scripts per section | gave up | errors | overlaps / lost writes | notes |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range sc.rows {
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | | | | | | | | | | | | %s |\n", r.name, status, r.na)
			continue
		}
		res := &r.res
		if res.rw == nil {
			p("| %s | not measured (see Errors) | | | | | | | | | %d | %d | %d / %d | %s |\n", rowName(r), res.busy, res.errs, res.overlaps, res.lost, r.note)
			continue
		}
		reads := fmtRate(res.readRate())
		if res.overlaps > 0 || res.lost > 0 {
			reads = "**FAILED: exclusion violated** (" + reads + ")"
		}
		ratio := "–"
		if b := rwBase(sc, r); b != nil && b.res.readRate() > 0 {
			ratio = fmt.Sprintf("%.2f×", res.readRate()/b.res.readRate())
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d | %d / %d | %s |\n", rowName(r), reads, fmtRate(res.writeRate()), ratio,
			fmtPct(res, 0.50), fmtPct(res, 0.99), res.writePct(0.50), res.writePct(0.99),
			res.rw.perOp(res.rw.commands), res.rw.perOp(res.rw.scripts), res.busy, res.errs, res.overlaps, res.lost, r.note)
	}
}

// The waiting cost of NetRWMutex.

// rwWaiter is a NetRWMutex as a locker of the waiting scenario: RLockCtx
// (a reader) or LockCtx (a writer).
type rwWaiter struct {
	m    *netlock.NetRWMutex
	read bool
}

func (l rwWaiter) reads() bool { return l.read }

func (l rwWaiter) lock(ctx context.Context) (func(context.Context) error, error) {
	if l.read {
		return netRW{l.m}.rlock(ctx)
	}
	return netRW{l.m}.lock(ctx)
}

// rwWaitingRows: waitingClients readers waiting behind a writer, and as
// many writers waiting behind a reader, for one netlock contender.
func rwWaitingRows(c *contender, addr string) []*row {
	mk := func(kind string, readersWait bool, note string) *row {
		name := rwRowName(kind, c.name)
		lname := lockName(rwWaitingID, name, 0, 0)
		return &row{name: name, c: c, note: note, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
			return func(ctx context.Context, window time.Duration, _ int) result {
				return runWaiting(ctx, c, addr, window, func(cls []client) (locker, []locker, error) {
					lockers := make([]locker, len(cls))
					for i, cl := range cls {
						nc, ok := cl.(*netlockClient)
						if !ok {
							return nil, nil, fmt.Errorf("%s is not netlock", c.name)
						}
						m, err := netlock.NewRW(lname, nc.backends)
						if err != nil {
							return nil, nil, err
						}
						// The holder reads when writers wait, and writes
						// when readers wait.
						lockers[i] = rwWaiter{m: m, read: (i == 0) != readersWait}
					}
					return lockers[0], lockers[1:], nil
				})
			}, func() {}, nil
		}}
	}
	return []*row{
		mk("NetRWMutex readers", true, fmt.Sprintf("%d readers (RLockCtx) wait while a writer (LockCtx) holds; its watchdog extends the write lock", waitingClients)),
		mk("NetRWMutex writers", false, fmt.Sprintf("%d writers (LockCtx) wait while a reader (RLockCtx) holds its process's read lease; its watchdog extends the lease", waitingClients)),
	}
}
