package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// A result is what one row measured, summed over its rounds.
type result struct {
	ran     bool
	ops     int64         // operations (or critical sections) completed before each round's deadline
	elapsed time.Duration // measured time, summed over rounds
	lat     []int64       // ns per operation (uncontended) or holder change (contended)

	busy     int64          // attempts that gave up while the lock was held elsewhere
	errs     int64          // other errors of lock or unlock
	errTexts map[string]int // distinct error texts, counted

	// Contended runs only.
	contended bool
	perWorker []int64 // acquisitions per client or goroutine
	changes   int64   // acquisitions by another worker than the previous holder
	selfs     int64   // acquisitions by the previous holder again
	overlaps  int64   // entries into a critical section that another worker was in
	lost      int64   // counter increments lost (acquisitions − final counter)

	// Scenarios with costOn: server µs of the commands run and heap
	// allocations of the process, over the measured rounds.
	costed     bool
	serverUsec int64
	mallocs    uint64

	// The waiting scenario only.
	wait *waitResult
	// The holds scenario only.
	holds *holdsResult
	// The read-mostly scenario only, summed over rounds.
	rw *rwResult
	// The sem4 scenario only, summed over rounds.
	sem *semStats
	// The once scenario only, summed over rounds.
	once *onceResult
}

func (r *result) addErr(err error) {
	r.errs++
	if r.errTexts == nil {
		r.errTexts = map[string]int{}
	}
	t := err.Error()
	if len(t) > 200 {
		t = t[:200] + "…"
	}
	if len(r.errTexts) < 20 || r.errTexts[t] > 0 {
		r.errTexts[t]++
	}
}

func (r *result) addIfErr(err error) {
	if err != nil {
		r.addErr(err)
	}
}

func (r *result) merge(o result) {
	r.ran = true
	r.ops += o.ops
	r.elapsed += o.elapsed
	r.lat = append(r.lat, o.lat...)
	r.busy += o.busy
	r.errs += o.errs
	for t, n := range o.errTexts {
		if r.errTexts == nil {
			r.errTexts = map[string]int{}
		}
		r.errTexts[t] += n
	}
	r.contended = r.contended || o.contended
	if len(r.perWorker) < len(o.perWorker) {
		r.perWorker = append(r.perWorker, make([]int64, len(o.perWorker)-len(r.perWorker))...)
	}
	for i, n := range o.perWorker {
		r.perWorker[i] += n
	}
	r.costed = r.costed || o.costed
	r.serverUsec += o.serverUsec
	r.mallocs += o.mallocs
	r.changes += o.changes
	r.selfs += o.selfs
	r.overlaps += o.overlaps
	r.lost += o.lost
	if o.wait != nil {
		r.wait = o.wait // measured once per row
	}
	if o.holds != nil {
		r.holds = o.holds // measured once per row
	}
	if o.rw != nil {
		if r.rw == nil {
			r.rw = &rwResult{}
		}
		r.rw.add(o.rw)
	}
	if o.sem != nil {
		if r.sem == nil {
			r.sem = &semStats{}
		}
		r.sem.add(o.sem)
	}
	if o.once != nil {
		if r.once == nil {
			r.once = &onceResult{}
		}
		r.once.add(o.once)
	}
}

// rate is operations per second.
func (r *result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

// serverPerOp is the server µs per operation, and allocsPerOp the
// allocations; ok is false where they were not measured.
func (r *result) serverPerOp() (float64, bool) {
	if !r.costed || r.ops == 0 {
		return 0, false
	}
	return float64(r.serverUsec) / float64(r.ops), true
}

func (r *result) allocsPerOp() (float64, bool) {
	if !r.costed || r.ops == 0 {
		return 0, false
	}
	return float64(r.mallocs) / float64(r.ops), true
}

// pct returns the q-quantile (0..1) of the latencies, nearest rank; ok is
// false without samples.
func (r *result) pct(q float64) (time.Duration, bool) {
	if len(r.lat) == 0 {
		return 0, false
	}
	if !slices.IsSorted(r.lat) {
		slices.Sort(r.lat)
	}
	i := int(q*float64(len(r.lat)) + 0.5)
	i = min(max(i-1, 0), len(r.lat)-1)
	return time.Duration(r.lat[i]), true
}

// selfPct is the share of acquisitions by the worker that held the lock
// just before.
func (r *result) selfPct() (float64, bool) {
	n := r.selfs + r.changes
	if n == 0 {
		return 0, false
	}
	return 100 * float64(r.selfs) / float64(n), true
}

// fairness is the fewest acquisitions of one worker over the most.
func (r *result) fairness() (ratio float64, lo, hi int64) {
	if len(r.perWorker) == 0 {
		return 0, 0, 0
	}
	lo, hi = slices.Min(r.perWorker), slices.Max(r.perWorker)
	if hi == 0 {
		return 0, lo, hi
	}
	return float64(lo) / float64(hi), lo, hi
}

// Formatting.

func fmtRate(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func fmtDur(d time.Duration) string {
	us := float64(d) / 1e3
	a := us
	if a < 0 {
		a = -a
	}
	switch {
	case a < 100:
		return fmt.Sprintf("%.1f µs", us)
	case a < 1000:
		return fmt.Sprintf("%.0f µs", us)
	case a < 100_000:
		return fmt.Sprintf("%.2f ms", us/1e3)
	default:
		return fmt.Sprintf("%.0f ms", us/1e3)
	}
}

func fmtPct(r *result, q float64) string {
	d, ok := r.pct(q)
	if !ok {
		return "–"
	}
	return fmtDur(d)
}

func sortedErrTexts(m map[string]int) []string {
	var out []string
	for t, n := range m {
		out = append(out, fmt.Sprintf("%d× %s", n, strings.ReplaceAll(t, "\n", " ")))
	}
	sort.Strings(out)
	return out
}
