package main

import (
	"context"
	"time"
)

// A waitReport tells, for "run -v", what netlock sees while it waits for
// the lock (or the leadership): who holds it, or that Redis does not answer
// and until when netlock keeps trying. It looks with netlock.Inspect (or
// Election.Leader), beside the wait.
type waitReport struct {
	r        *runner
	start    time.Time // of the wait
	deadline time.Time // of --wait; zero without
	// down is when a look first found Redis not answering, of the looks in
	// a row that did; zero while it answers. The wait has found it so no
	// later (a look goes through the same nodes), so that it gives up
	// within the outage window (--expiry) of down, or at --wait's deadline.
	down time.Time
}

// run looks every waitReportEvery until done is closed.
func (w *waitReport) run(ctx context.Context, done <-chan struct{}) {
	tick := time.NewTicker(waitReportEvery)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		w.look(ctx, done)
	}
}

// look asks Redis about the lock and says what it found. The first look
// (done nil) says only who holds the lock, if anyone, or that Redis does
// not answer; later ones say also that netlock still waits.
func (w *waitReport) look(ctx context.Context, done <-chan struct{}) {
	r := w.r
	who, held, err := r.h.holder(ctx)
	if d, ok := ctx.Deadline(); ctx.Err() != nil || ok && !time.Now().Before(d) {
		// The wait ended, and may have cut the look short: what it found
		// says nothing of Redis. (ctx's deadline may have passed a moment
		// before ctx.Err says so.)
		return
	}
	select {
	case <-done:
		// The wait ended while Inspect ran: the holder it saw may be this
		// very netlock.
		return
	default:
	}
	now := time.Now()
	if err != nil {
		if w.down.IsZero() {
			w.down = now
		}
		until := w.down.Add(r.cfg.expiry) // the outage window
		if !w.deadline.IsZero() && w.deadline.Before(until) {
			until = w.deadline
		}
		still := ""
		if done != nil {
			still = "still waiting for " + r.h.what() + " after " + now.Sub(w.start).Round(time.Millisecond).String() + ": "
		}
		r.logf("%s%s; retrying until %s at the latest", still, r.cfg.conn.failure(err), until.Format(time.TimeOnly))
		return
	}
	w.down = time.Time{}
	switch {
	case done == nil && held:
		upTo := ""
		if !w.deadline.IsZero() {
			upTo = " up to " + r.cfg.wait.String()
		}
		r.logf("%s is held elsewhere (%s); waiting%s", r.h.what(), who, upTo)
	case done == nil:
	case held:
		r.logf("still waiting for %s after %v: held elsewhere (%s)", r.h.what(), now.Sub(w.start).Round(time.Millisecond), who)
	default:
		r.logf("still waiting for %s after %v: free at this moment", r.h.what(), now.Sub(w.start).Round(time.Millisecond))
	}
}

// holder says, for a message, who holds the lock (or leads): "(fencing
// token 7, TTL 9.5s)", with held true; or that it is free, or why that
// cannot be told. It asks Redis, within the node timeout.
func (r *runner) holder(ctx context.Context) (state string, held bool) {
	who, held, err := r.h.holder(ctx)
	switch {
	case err != nil:
		return "who holds it cannot be told: " + r.cfg.conn.failure(err), false
	case held:
		return "(" + who + ")", true
	}
	return "free at this moment", false
}
