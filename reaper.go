package netlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A reaper delivers releases that could not be delivered when they were
// sent: to a node that was stalled, partitioned or reconnecting when an
// acquire round failed or a hold was unlocked. Such a node may still run our
// acquire when it comes back; one release that reaches it afterwards (or a
// tombstone it leaves, if it arrives first) keeps the key from being
// stranded until its TTL runs out.
//
// It also sends a waiter's leave of the queue that could not be sent, or
// was cut short by the caller's ctx (see engine.leave), and a Semaphore
// lease's count again after a call's reply was lost (see Semaphore.resend):
// each thing pending is a redelivery, which knows what to send and when it
// is over. A leave is sent again at once (reapNow): a turn a release may
// have given the waiter that left is another waiter's time; the rest after
// a pause.
//
// Its goroutine runs only while redeliveries are pending and ends when
// every one is over: a release is over once answered, its client was
// closed, or it is older than the tombstone TTL (after that, a delivery
// would no longer stop a late acquire).
type reaper struct {
	mu      sync.Mutex
	pending []redelivery
	running bool
	// now asks the running goroutine for a pass at once (see reapNow);
	// buffered, made with the first.
	now chan struct{}
	// passing is the batch a pass is sending, out of pending meanwhile.
	passing []redelivery
}

// A redelivery is one thing the reaper sends again until it is over.
type redelivery interface {
	// deliver sends it once more, and reports whether it is over; if not,
	// the reaper sends it again after a pause.
	deliver(m *engine) bool
}

// A pendingLeave is a leave of a waiters' queue by member on one node (see
// engine.leave).
type pendingLeave struct {
	node   int
	member string
	giveUp time.Time
}

// deliver sends the leave once more (see redelivery). It is over once
// answered, or once nothing can take it; after ten expiries, whatever the
// queue kept of member is long gone.
func (p *pendingLeave) deliver(m *engine) bool {
	if m.clk.Now().After(p.giveUp) {
		return true
	}
	sent, cancel := m.bound(context.Background())
	s, keys, args := m.kind.leaveCall(p.member)
	rep := m.call(context.Background(), sent, p.node, s, keys, args)
	unbound(sent, cancel)
	return rep.err == nil || rep.over()
}

// A pendingRelease is a release of value on one node.
type pendingRelease struct {
	node   int
	value  string
	giveUp time.Time
	err    error // the last delivery's
	held   bool  // value was held on some node (see engine.release)
}

// reapLater queues releases of value for the nodes whose replies were
// errors, and starts the reaper's goroutine if it is not running.
func (m *engine) reapLater(value string, replies []nodeReply, targets []bool, held bool) {
	r := &m.reaper
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, rep := range replies {
		if (targets == nil || targets[i]) && rep.err != nil && !rep.over() {
			r.pending = append(r.pending, &pendingRelease{node: i, value: value, giveUp: m.clk.Now().Add(tombstoneExpiries * m.cfg.expiry), err: rep.err, held: held})
		}
	}
	m.reapLocked()
}

// resending reports whether a release of value waits in the reaper to be
// sent again.
func (m *engine) resending(value string) bool {
	return m.reaper.any(func(d redelivery) bool {
		p, ok := d.(*pendingRelease)
		return ok && p.value == value
	})
}

// any reports whether match holds for a redelivery pending or being sent.
func (r *reaper) any(match func(redelivery) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ps := range [][]redelivery{r.pending, r.passing} {
		for _, d := range ps {
			if match(d) {
				return true
			}
		}
	}
	return false
}

// reapAgain queues d, and starts the reaper's goroutine if it is not
// running.
func (m *engine) reapAgain(d redelivery) {
	r := &m.reaper
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, d)
	m.reapLocked()
}

// reapNow queues ds and has them sent at once, on the reaper's goroutine.
func (m *engine) reapNow(ds ...redelivery) {
	r := &m.reaper
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, ds...)
	m.reapLocked()
	select {
	case r.now <- struct{}{}:
	default: // a pass is asked for already
	}
}

// reapLocked starts the reaper's goroutine if redeliveries are pending and
// it is not running. The caller holds m.reaper.mu.
func (m *engine) reapLocked() {
	r := &m.reaper
	if r.now == nil {
		r.now = make(chan struct{}, 1)
	}
	if len(r.pending) > 0 && !r.running {
		r.running = true
		go m.reap(r.now)
	}
}

// The reaper's pause between passes doubles from reapFirstPause to
// reapMaxPause: a node back from a blip gets its release at once, one that
// stays away costs a call every quarter second.
const (
	reapFirstPause = 10 * time.Millisecond
	reapMaxPause   = 250 * time.Millisecond
)

// reap retries the pending redeliveries, with a growing pause between
// passes, until none is left, and at once when asked on now.
func (m *engine) reap(now <-chan struct{}) {
	r := &m.reaper
	pause := reapFirstPause
	t := time.NewTimer(pause) // a retry delay: the real clock
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-now:
		}
		r.mu.Lock()
		batch := r.pending
		r.pending, r.passing = nil, batch
		r.mu.Unlock()

		var left []redelivery
		for _, p := range batch {
			if !p.deliver(m) {
				left = append(left, p)
			}
		}

		r.mu.Lock()
		r.pending, r.passing = append(left, r.pending...), nil
		if len(r.pending) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		pause = min(2*pause, reapMaxPause)
		t.Reset(pause)
	}
}

// deliver sends the release once more (see redelivery).
func (p *pendingRelease) deliver(m *engine) bool {
	if m.clk.Now().After(p.giveUp) {
		m.reapGaveUp(*p, "the tombstone's lifetime ended: a late acquire can no longer take the key", p.err)
		return true
	}
	sent, cancel := m.bound(context.Background())
	s, keys, args := m.kind.releaseCall(p.value, m.tomb(p.value, ""))
	rep := m.call(context.Background(), sent, p.node, s, keys, args)
	unbound(sent, cancel)
	switch {
	case rep.err == nil:
		return true
	case rep.over():
		m.reapGaveUp(*p, "the node answered with an error that sending again cannot change, refused the connection, or its client is closed", rep.err)
		return true
	}
	p.err = rep.err
	return false
}

// permanentErr reports whether err, from a call to b of a script doing op,
// is an answer that retrying cannot change: an error reply (a key of
// another type, a missing permission, a script the server refuses) other
// than a refusal for the moment (see transientReply); or a closed client.
// A waiter gives up at once on it, where it rides out anything else (see
// WithOutageWindow), and a release is sent again unless its reply was
// permanent (see nodeReply.over). Every Backend's errors go through here,
// raw, as the Backend returned them: this is the one place that tells
// them apart.
func permanentErr(b Backend, op scriptOp, err error) bool {
	f, ok := b.(ErrorClassifier)
	return ok && f.Final(err) && !transientReply(op, err.Error())
}

// transientReply reports whether msg is an error reply by which the server
// refuses a call of a script doing op for the moment, having done nothing
// of it: a server loading its data after a restart, busy running a
// script, a replica (a failover demoted it), a cluster or replica set
// reconfiguring, out of clients, or unable to persist. UNBLOCKED is what
// a WAIT (WithSyncReplicas) gets when its master turns replica under it in
// a failover. A server out of memory (maxmemory with noeviction) refuses a
// release only until a moment frees memory, as the release itself would:
// for an acquire, OOM is an answer. So is an ACL's refusal (NOPERM), which
// for a release or a leave is sent again while the hold's expiry allows:
// a release or a leave dropped for an ACL fixed a moment later would leave
// a key, or a waiter's place, that a release grants the lock to, for
// nobody, for an expiry.
func transientReply(op scriptOp, msg string) bool {
	for _, p := range transientReplies {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return op == opRelease && (strings.HasPrefix(msg, "OOM") || strings.HasPrefix(msg, "NOPERM"))
}

// transientReplies are the prefixes of the error replies that transientReply
// takes for a refusal for the moment, whatever the script.
var transientReplies = []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "NOREPLICAS", "MISCONF", "UNBLOCKED", "ERR max number of clients"}

// over reports whether r, an error, leaves nothing to send again: the
// answer will not change (see permanentErr), or nothing listens on the
// node (a connection refused: whatever we sent it before died with its
// process, and a key it had persisted keeps its TTL).
func (r nodeReply) over() bool {
	return r.permanent || errors.Is(r.err, syscall.ECONNREFUSED)
}
