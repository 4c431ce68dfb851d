package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
)

// The MultiMutex scenarios (multi2, multi4): processes each taking k of a
// ring of multiNames names at once, with one MultiMutex, against the same
// work with k NetMutexes locked one by one in sorted order (the classic way
// to avoid a deadlock).
const (
	multiProcesses = 8 // clients, each its own connections, as processes; one goroutine each
	multiNames     = 8 // the ring of names the processes' sets are drawn from
)

var multiSizes = []int{2, 4}

func multiID(k int) string { return fmt.Sprintf("multi%d", k) }

// multiSlotsID names the scenario of k names in several slots of a Redis
// Cluster.
func multiSlotsID(k int) string { return fmt.Sprintf("multi%dslots", k) }

// multiScenarios returns the multi2 and multi4 scenarios, without rows.
func multiScenarios() []scenario {
	var scs []scenario
	for i, k := range multiSizes {
		scs = append(scs, scenario{
			id: multiID(k), title: fmt.Sprintf("13%c. MultiMutex of %d names: %d processes on a ring of %d names, against %d NetMutexes in sorted order", 'a'+i, k, multiProcesses, multiNames, k),
			what: fmt.Sprintf("%d clients, each its own client object and connections (like separate processes), one goroutine each. Process p takes the %d names p to p+%d of a ring of %d (so each name is wanted by %d processes), runs the critical section (%s, `-rwsection`), and gives them back, in a loop. "+
				"MultiMutex rows: one *MultiMutex of the %d names per process, given them in ring order (odd processes in reverse): LockCtx … UnlockCtx. "+
				"NetMutex×%d rows, the comparison: one *NetMutex per name, locked one by one in sorted order and unlocked in reverse. "+
				"Sets/s: sections whose acquire returned before the round's deadline; × NetMutex's: against that row of the same client. Acquire wait: from the first LockCtx called to the last one's return, p50/p99. "+
				"Commands and scripts per set as in scenario 9. Overlaps: a section that found another inside one of its names; must be 0.",
				multiProcesses, k, k-1, multiNames, k, sectionHow(rwSection), k, k),
			shape:  shapeMulti,
			strict: true,
		})
	}
	return scs
}

// multiSlotsScenarios returns the multi2slots and multi4slots scenarios,
// without rows: multi2 and multi4 on a Redis Cluster, where the names are
// in several hash slots.
func multiSlotsScenarios() []scenario {
	var scs []scenario
	for i, k := range multiSizes {
		scs = append(scs, scenario{
			id: multiSlotsID(k), title: fmt.Sprintf("13%c. MultiMutex of %d names in several slots of a Redis Cluster: %d processes on a ring of %d names, against %d NetMutexes in sorted order", 'c'+i, k, multiProcesses, multiNames, k),
			what: fmt.Sprintf("As scenario 13%c, on a Redis Cluster of %d masters (started by bench, slots spread evenly by redis-cli --cluster create), each process a cluster client of its own (rueidis, go-redis ClusterClient; redigo has none). "+
				"The names have no hash tag, so a set's %d names are in %d slots (at random among the masters): a MultiMutex takes them one slot at a time, in slot order, and waits for a busy slot holding none (docs/multi.md, \"Names in several slots\"). "+
				"Commands and scripts per set: summed over the masters.",
				'a'+i, clusterMasters, k, k),
			shape:  shapeMulti,
			strict: true,
		})
	}
	return scs
}

// A multiOn is where a multi row runs: how it connects its processes, and
// the measuring connections to every server.
type multiOn struct {
	id   string // the scenario's
	open func(c *contender, n int) (probes []redis.Conn, cls []client, cleanup func(), err error)
}

// onServer runs scenario id's rows on the server at addr.
func onServer(id, addr string) multiOn {
	return multiOn{id: id, open: func(c *contender, n int) ([]redis.Conn, []client, func(), error) {
		probe, cls, cleanup, err := probeAndConnect(c, addr, n)
		return []redis.Conn{probe}, cls, cleanup, err
	}}
}

// onCluster runs scenario id's rows on the Redis Cluster (clusterAddrs),
// each process a cluster client.
func onCluster(id string) multiOn {
	return multiOn{id: id, open: func(c *contender, n int) ([]redis.Conn, []client, func(), error) {
		addrs, err := clusterAddrs()
		if err != nil {
			return nil, nil, nil, err
		}
		var probes []redis.Conn
		var cls []client
		cleanup := func() {
			for _, cl := range cls {
				cl.close()
			}
			for _, p := range probes {
				p.Close()
			}
		}
		for _, a := range addrs {
			p, err := dialProbe(a)
			if err != nil {
				cleanup()
				return nil, nil, nil, err
			}
			probes = append(probes, p)
		}
		for range n {
			cl, err := c.connectCluster(addrs)
			if err != nil {
				cleanup()
				return nil, nil, nil, err
			}
			cls = append(cls, cl)
		}
		return probes, cls, cleanup, nil
	}}
}

// A multiSet is what one process of a multi scenario takes and gives back.
type multiSet interface {
	take(ctx context.Context) error
	give() error
}

type multiMutexSet struct{ m *netlock.MultiMutex }

func (s multiMutexSet) take(ctx context.Context) error { return s.m.LockCtx(ctx) }
func (s multiMutexSet) give() error                    { return s.m.UnlockCtx(context.Background()) }

// sortedMutexes locks its NetMutexes in order and unlocks them in reverse.
type sortedMutexes []*netlock.NetMutex

func (s sortedMutexes) take(ctx context.Context) error {
	for i, m := range s {
		if err := m.LockCtx(ctx); err != nil {
			for j := i - 1; j >= 0; j-- {
				s[j].UnlockCtx(context.Background())
			}
			return err
		}
	}
	return nil
}

func (s sortedMutexes) give() error {
	var first error
	for i := len(s) - 1; i >= 0; i-- {
		if err := s[i].UnlockCtx(context.Background()); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// multiRing returns the ring positions of process p's k names, in the
// order it gives them.
func multiRing(p, k int) []int {
	pos := make([]int, k)
	for j := range pos {
		pos[j] = (p + j) % multiNames
	}
	if p%2 == 1 {
		slices.Reverse(pos)
	}
	return pos
}

// multiRows are the rows of the multi scenario of k names for one netlock
// contender.
func multiRows(c *contender, on multiOn, k int) []*row {
	return []*row{
		multiRow(c, on, k, "MultiMutex", fmt.Sprintf("one *MultiMutex of %d names per process", k),
			func(names []string, b []netlock.Backend) (multiSet, error) {
				m, err := netlock.NewMulti(names, b)
				return multiMutexSet{m}, err
			}),
		multiRow(c, on, k, fmt.Sprintf("NetMutex×%d", k), fmt.Sprintf("%d *NetMutex per process, locked in sorted order", k),
			func(names []string, b []netlock.Backend) (multiSet, error) {
				names = slices.Sorted(slices.Values(names))
				ms := make(sortedMutexes, len(names))
				for i, name := range names {
					var err error
					if ms[i], err = netlock.New(name, b); err != nil {
						return nil, err
					}
				}
				return ms, nil
			}),
	}
}

func multiRow(c *contender, on multiOn, k int, kind, note string, newSet func(names []string, b []netlock.Backend) (multiSet, error)) *row {
	name := rwRowName(kind, c.name)
	id := on.id
	return &row{name: name, c: c, note: note, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		probes, cls, cleanup, err := on.open(c, multiProcesses)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, dur time.Duration, round int) result {
			var res result
			sets := make([]multiSet, len(cls))
			for p, cl := range cls {
				nc, ok := cl.(*netlockClient)
				if !ok {
					res.addErr(fmt.Errorf("%s is not netlock", c.name))
					return res
				}
				var names []string
				for _, i := range multiRing(p, k) {
					names = append(names, lockName(id, name, round, i))
				}
				if sets[p], err = newSet(names, nc.backends); err != nil {
					res.addErr(err)
					return res
				}
			}
			before := make([]commandStats, len(probes))
			for i, probe := range probes {
				if before[i], err = readCommandStats(probe); err != nil {
					res.addErr(err)
					return res
				}
			}
			res = runMulti(ctx, dur, k, sets)
			for i, probe := range probes {
				after, err := readCommandStats(probe)
				if err != nil {
					res.addErr(err)
					continue
				}
				n, _ := after.since(before[i])
				delta := func(cmd string) int64 { return after.calls[cmd] - before[i].calls[cmd] }
				res.sem.commands += n - delta("ping")
				res.sem.scripts += delta("evalsha") + delta("eval")
			}
			if res.overlaps > 0 {
				res.addErr(fmt.Errorf("EXCLUSION VIOLATED: %d sections found another holder of one of their names inside", res.overlaps))
			}
			return res
		}, cleanup, nil
	}}
}

// runMulti has process p loop on sets[p] for dur: take, a critical section
// (rwSection), give back. A counter per name of the ring catches two
// holders of one name at once.
func runMulti(ctx context.Context, dur time.Duration, k int, sets []multiSet) result {
	rctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	deadline := time.Now().Add(dur)
	var inside [multiNames]atomic.Int64
	var overlaps atomic.Int64
	parts := make([]result, len(sets))
	var wg sync.WaitGroup
	for p, set := range sets {
		ring := multiRing(p, k)
		wg.Go(func() {
			r := &parts[p]
			lat := make([]int64, 0, 4096)
			for rctx.Err() == nil {
				t0 := time.Now()
				err := set.take(rctx)
				t1 := time.Now()
				if err != nil {
					if r.failed(rctx, deadline, err) {
						break
					}
					continue
				}
				ok := true
				for _, i := range ring {
					ok = inside[i].Add(1) == 1 && ok
				}
				section(rwSection)
				for _, i := range ring {
					inside[i].Add(-1)
				}
				if !ok {
					overlaps.Add(1)
				}
				r.addIfErr(set.give())
				if t1.After(deadline) {
					break
				}
				r.ops++
				lat = append(lat, t1.Sub(t0).Nanoseconds())
			}
			r.lat = lat
		})
	}
	wg.Wait()
	total := result{sem: &semStats{perGoroutine: make([]int64, len(parts))}, perWorker: make([]int64, len(parts))}
	for i, part := range parts {
		total.sem.perGoroutine[i] = part.ops
		total.perWorker[i] = part.ops
		part.perWorker = nil
		total.merge(part)
	}
	total.elapsed = dur
	total.overlaps = overlaps.Load()
	return total
}

func writeMultiTable(p printer, sc *scenario) {
	p("| contender | sets/s | × NetMutex's | acquire wait p50 | p99 | per process min/max | Jain's index | commands per set | scripts per set | gave up | errors | overlaps | notes |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range sc.rows {
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | | | | | | | | | | | %s |\n", r.name, status, r.na)
			continue
		}
		res := &r.res
		if res.sem == nil {
			p("| %s | not measured (see Errors) | | | | | | | | %d | %d | %d | %s |\n", rowName(r), res.busy, res.errs, res.overlaps, r.note)
			continue
		}
		rate := fmtRate(res.rate())
		if res.overlaps > 0 {
			rate = "**FAILED: two holders of one name** (" + rate + ")"
		}
		ratio := "–"
		if b := multiBase(sc, r); b != nil && b.res.rate() > 0 {
			ratio = fmt.Sprintf("%.2f×", res.rate()/b.res.rate())
		}
		per := func(n int64) string {
			if res.ops == 0 {
				return "–"
			}
			return fmtRate(float64(n) / float64(res.ops))
		}
		p("| %s | %s | %s | %s | %s | %d/%d | %.3f | %s | %s | %d | %d | %d | %s |\n", rowName(r), rate, ratio,
			fmtPct(res, 0.50), fmtPct(res, 0.99), slices.Min(res.perWorker), slices.Max(res.perWorker), jain(res.perWorker),
			per(res.sem.commands), per(res.sem.scripts), res.busy, res.errs, res.overlaps, r.note)
	}
}

// multiBase is the NetMutex row of a MultiMutex row (same client), nil if
// there is none or it has no figures.
func multiBase(sc *scenario, r *row) *row {
	if !strings.HasPrefix(r.name, "MultiMutex/") {
		return nil
	}
	for _, b := range sc.rows {
		if b.c == r.c && strings.HasPrefix(b.name, "NetMutex×") {
			if _, ok := rowStatus(b); ok {
				return b
			}
		}
	}
	return nil
}
