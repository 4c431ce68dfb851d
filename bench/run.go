package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// errorPause slows a goroutine whose operation keeps failing, so that a
// broken contender does not spin the CPU away from the others.
const errorPause = time.Millisecond

// runOps runs ops[i] in a loop on goroutine i for dur and times each call.
// Only calls that return before the deadline count. A call cut short by the
// deadline is neither counted nor an error.
func runOps(ctx context.Context, dur time.Duration, ops []func(context.Context) error) result {
	rctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	deadline := time.Now().Add(dur)
	parts := make([]result, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		wg.Go(func() {
			r := &parts[i]
			lat := make([]int64, 0, 4096)
			for rctx.Err() == nil {
				t0 := time.Now()
				err := op(rctx)
				t1 := time.Now()
				if err != nil {
					if r.failed(rctx, deadline, err) {
						break
					}
					continue
				}
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
	var total result
	for _, p := range parts {
		total.merge(p)
	}
	total.elapsed = dur
	return total
}

// failed counts a call that returned err: a refusal (busy) or an error,
// after which it pauses a moment. It reports whether the round is over (its
// deadline cut the call short), in which case nothing is counted.
func (r *result) failed(rctx context.Context, deadline time.Time, err error) (over bool) {
	if cutShort(rctx, deadline) {
		return true
	}
	if errors.Is(err, errBusy) {
		r.busy++
	} else {
		r.addErr(err)
		time.Sleep(errorPause)
	}
	return false
}

// cutShort reports whether a call that failed was cut short by the end of
// the round rather than failing on its own: ctx is done, or deadline or
// ctx's own deadline has passed. The context's Err can lag behind its
// deadline: a client that turned the deadline into a socket deadline may
// fail with an I/O timeout, and a library that compares the time with the
// deadline may return context.DeadlineExceeded, before the context's timer
// has fired.
func cutShort(ctx context.Context, deadline time.Time) bool {
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	return ctx.Err() != nil || !time.Now().Before(deadline)
}

// lockUnlock is one uncontended operation: lock, then unlock at once.
func lockUnlock(l locker) func(context.Context) error {
	return func(ctx context.Context) error {
		unlock, err := l.lock(ctx)
		if err != nil {
			return err
		}
		// Not ctx: a hold taken just before the deadline is still released.
		return unlock(context.Background())
	}
}

// runContended has worker i loop on lockers[i] for dur: lock, a critical
// section, unlock. Several workers may share one locker. The critical
// section increments a counter with a separate load and store, so two
// workers inside at once lose an update, and it counts entries that found
// another worker inside (overlaps); both must stay 0.
//
// Each critical section also takes its sequence number from the counter, so
// the acquisitions can be put in order afterwards: holder changes, their
// latency (unlock returning in one worker to lock returning in the next
// holder), self-reacquisitions and acquisitions per worker.
func runContended(ctx context.Context, dur time.Duration, lockers []locker) result {
	rctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	start := time.Now()
	deadline := start.Add(dur)
	limit := dur.Nanoseconds()

	var (
		inside   atomic.Int32
		counter  atomic.Int64
		overlaps atomic.Int64
	)
	type acquisition struct{ seq, locked, unlocked int64 } // ns since start
	acqs := make([][]acquisition, len(lockers))
	parts := make([]result, len(lockers))
	var wg sync.WaitGroup
	for i, l := range lockers {
		wg.Go(func() {
			r := &parts[i]
			for rctx.Err() == nil {
				unlock, err := l.lock(rctx)
				locked := time.Since(start).Nanoseconds()
				if err != nil {
					if r.failed(rctx, deadline, err) {
						break
					}
					continue
				}

				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				seq := counter.Load()
				counter.Store(seq + 1)
				inside.Add(-1)

				err = unlock(context.Background())
				unlocked := time.Since(start).Nanoseconds()
				if err != nil {
					r.addErr(err)
				}
				acqs[i] = append(acqs[i], acquisition{seq, locked, unlocked})
			}
		})
	}
	wg.Wait()

	total := result{contended: true, perWorker: make([]int64, len(lockers))}
	for _, p := range parts {
		total.merge(p)
	}
	total.elapsed = dur
	total.overlaps = overlaps.Load()

	// Put the acquisitions in sequence order. Overlapping critical sections
	// may have taken the same number; such numbers are left out.
	n := counter.Load()
	type slot struct {
		worker           int
		locked, unlocked int64
		dup              bool
	}
	bySeq := make([]slot, n)
	filled := make([]bool, n)
	var all int64
	for w, as := range acqs {
		for _, a := range as {
			all++
			if a.locked <= limit {
				total.ops++
				total.perWorker[w]++
			}
			if a.seq < 0 || a.seq >= n {
				continue
			}
			if filled[a.seq] {
				bySeq[a.seq].dup = true
				continue
			}
			filled[a.seq] = true
			bySeq[a.seq] = slot{worker: w, locked: a.locked, unlocked: a.unlocked}
		}
	}
	total.lost = all - n
	for k := int64(1); k < n; k++ {
		prev, cur := bySeq[k-1], bySeq[k]
		if !filled[k-1] || !filled[k] || prev.dup || cur.dup || cur.locked > limit {
			continue
		}
		if cur.worker == prev.worker {
			total.selfs++
			continue
		}
		total.changes++
		total.lat = append(total.lat, cur.locked-prev.unlocked)
	}
	return total
}
