package main

import (
	"context"
	"strconv"
	"time"

	"github.com/netlock-go/netlock"
)

// A waitReport tells, for "run -v", what netlock sees while it waits for
// the lock: who holds it, or that Redis does not answer and until when
// netlock keeps trying. It looks with netlock.Inspect, beside the wait.
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
	info, err := netlock.Inspect(ctx, r.cfg.name, r.backends, r.opts...)
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
			still = "still waiting for the lock " + strconv.Quote(r.cfg.name) + " after " + now.Sub(w.start).Round(time.Millisecond).String() + ": "
		}
		r.logf("%s%s; retrying until %s at the latest", still, r.cfg.conn.failure(err), until.Format(time.TimeOnly))
		return
	}
	w.down = time.Time{}
	switch {
	case done == nil && info.Held:
		upTo := ""
		if !w.deadline.IsZero() {
			upTo = " up to " + r.cfg.wait.String()
		}
		r.logf("the lock %q is held elsewhere (%s); waiting%s", r.cfg.name, holdText(info), upTo)
	case done == nil:
	case info.Held:
		r.logf("still waiting for the lock %q after %v: held elsewhere (%s)", r.cfg.name, now.Sub(w.start).Round(time.Millisecond), holdText(info))
	default:
		r.logf("still waiting for the lock %q after %v: free at this moment", r.cfg.name, now.Sub(w.start).Round(time.Millisecond))
	}
}

// holder says, for a message, who holds the lock: "(fencing token 7, TTL
// 9.5s)", with held true; or that it is free, or why that cannot be told.
// It asks Redis (netlock.Inspect), within the node timeout.
func (r *runner) holder(ctx context.Context) (state string, held bool) {
	info, err := netlock.Inspect(ctx, r.cfg.name, r.backends, r.opts...)
	switch {
	case err != nil:
		return "who holds it cannot be told: " + r.cfg.conn.failure(err), false
	case info.Held:
		return "(" + holdText(info) + ")", true
	}
	return "free at this moment", false
}
