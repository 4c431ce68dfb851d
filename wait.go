package netlock

import (
	"context"
	"crypto/rand"
	mrand "math/rand/v2"
	"strings"
	"time"
)

// A waiter is one acquire call (LockCtx, TryLockCtx, a Semaphore's Acquire)
// talking to Redis, as its acquirer has it take its kind of lock, with
// everything its wait needs: the watches of its release channel, its place
// in the waiters' queues, its timer and its backoff. It is never shared
// between calls and ends with its call.
//
// A waiter waits for its turn, not for time to pass. Between attempts it
// sleeps until the first of:
//   - a release naming it on its channel: its turn;
//   - its pub/sub connection failing, which may have lost the message: it
//     watches again and attempts;
//   - the holder's remaining TTL running out: a holder that died releases
//     nothing. A holder that lives has extended meanwhile, and the attempt
//     learns the new TTL: about one attempt per expiry, the whole cost of
//     waiting to Redis;
//   - ctx ending.
//
// Every other way a turn can vanish has its own mechanism: a release skips
// the queued waiters nobody listens for (their process died), see
// lua/release.lua; a waiter that gives up after a release named it passes
// its turn on (lua/leave.lua); a waiter missing from the queue (the queue
// key lost to a restart, FLUSHALL or eviction) joins it again with its next
// attempt (lua/acquire.lua); a waiter that lost the race for the key after
// its turn came goes back to the head of the queue.
//
// Only a waiter that cannot listen (a Backend without pub/sub, or a
// subscription that could not be made) polls: after jittered delays growing
// from the minimum retry delay to the maximum, bounded by the holder's TTL.
// While the nodes do not answer at all, a waiter retries with the same
// delays for at most the outage window (WithOutageWindow).
type waiter struct {
	m    *engine
	a    acquirer // how the call's kind acquires
	wait bool     // LockCtx; TryLockCtx makes one attempt
	busy bool     // an attempt found the lock held

	// wake, capacity 1: a message on our channel, or "" for a connection
	// failed (or, from a Semaphore's waiters, see Semaphore.pokeFirstLocked, a reason
	// to look again). Made by init unless given.
	wake    chan string
	watches []*watch // per node; nil where not watching
	failed  []int    // per node: watches that failed since the nodes last answered
	queued  bool     // some node's waiters' queue may hold our member
	turn    bool     // a release named us: an attempt that loses goes back to the head
	// nonce names one join of the queue, when a release may grant us the
	// lock (m.grants): fresh for each, so that a grant's message names the
	// join it answers. joined is when the first round that could add it
	// began, before the release that grants it can have run.
	nonce   string
	joined  time.Time
	arrival int64 // a NetRWMutex's waiter's place (see ask)
	// splits counts the rounds in a row whose votes split (see refused).
	splits  int
	timer   *time.Timer
	delay   backoff   // polling, and retries while the nodes do not answer
	down    time.Time // when the nodes stopped answering; zero while they answer
	downErr error     // the last round's error while they do not answer
}

// maxBallots bounds the immediate retries after refused ballots: each
// learns every answering node's counter, so one usually suffices; more are
// needed only while other clients keep winning.
const maxBallots = 3

// maxWatchFailures bounds the attempts in a row to watch one node's
// channel while the node answers scripts: a node whose pub/sub cannot be set
// up (a proxy that refuses it, a stalled dial) is tried again only after an
// outage, and its waiter polls meanwhile. Not for a Hub with sharded pub/sub
// (a Redis Cluster): there a watch fails for a while after a failover,
// until the client's slot map names the new master, while the scripts,
// redirected by MOVED, are answered all along; it is tried again with every
// attempt, or the waiter would poll, and a waiter that polls takes no place
// in the queue, so the waiters granted the lock in turn would pass it over
// for as long as they keep coming.
const maxWatchFailures = 2

// maxSplits bounds the quick retries after rounds whose votes split: the
// clients attempting together are done in a round or two, and one of them
// wins. Votes that keep splitting mean that no retry will win: a minority
// of nodes has no key where the holder's quorum has its (a release that
// reached it late, after the holder's acquire found it busy there), and
// stays so for the whole hold. Then the waiter waits as for a held lock,
// by message and the holder's TTL, instead of attempting every round trip.
const maxSplits = 3

// acquire runs acquire rounds until one succeeds; with wait false (TryLock)
// it makes just one attempt. It reports false, with a nil error, only when
// wait is false and the lock is held elsewhere; and whether an attempt found
// the lock held. The caller owns m.
func (m *engine) acquire(ctx context.Context, wait bool) (ok, busy bool, err error) {
	m.checkServers(ctx)
	w := waiter{m: m, a: quorumAcquirer{m}, wait: wait, delay: backoff{min: m.cfg.minRetryDelay, max: m.cfg.maxRetryDelay}}
	ok, err = w.run(ctx)
	w.done(ctx, ok)
	return ok, w.busy, err
}

func (w *waiter) run(ctx context.Context) (bool, error) {
	m := w.m
	if w.wait {
		if err := w.yield(ctx); err != nil {
			return false, err
		}
		// Where the channel is subscribed already (this Backend's waiters
		// have been waiting for this lock lately), watch it before the
		// first attempt: no round trip, and no second attempt needed.
		w.join()
	}
	for ballots := 0; ; {
		q := w.ask()
		w.queued = w.queued || q.flags != "" // the flags say "queue me" or "I may be queued"
		w.turn = false
		w.drain() // a wake-up from before this attempt is answered by it
		if q.nonce != "" && strings.Contains(q.flags, "j") && w.joined.IsZero() {
			w.joined = m.clk.Now()
		}
		o := w.a.round(ctx, q)
		if o.rejoin {
			// Our member is gone from the queue: join again, at once,
			// under a fresh nonce.
			m.mu.Lock()
			m.gaveUpLocked(w.nonce)
			m.mu.Unlock()
			w.nonce, w.joined, w.queued = "", time.Time{}, false
			continue
		}
		switch o.kind {
		case acquired:
			return w.acquired(ctx, o.grant, o.unqueue)
		case ended:
			return false, w.endedRound(o)
		case failed:
			// A client closed meanwhile fails its calls at once: the
			// waiter may still be in the queue, and its Hub listening.
			w.leaveClosed(ctx)
			return false, o.err
		case down:
			if err := w.rideOut(ctx, o.err); err != nil {
				return false, err
			}
			continue
		case ballot:
			if ballots < maxBallots {
				// The lock is free; the retry proposes above the counters
				// just learned. Part of one attempt, even for TryLock.
				ballots++
				continue
			}
		}
		ballots = 0
		if ok, err := w.refused(ctx, o); ok || err != nil || !w.wait {
			return ok, err
		}
	}
}

// refused waits, after a round that found the lock held (or split the
// votes), for the next attempt: its turn, by message, or a grant. It
// reports whether a release granted it the lock (the hold is then m's).
// TryLock does not wait.
func (w *waiter) refused(ctx context.Context, o outcome) (bool, error) {
	w.answered()
	w.busy = true
	if !w.wait {
		return false, nil
	}
	w.splits++
	if o.kind != split {
		w.splits = 0
	}
	var err error
	switch {
	case o.kind == ballot || o.kind == split && w.splits <= maxSplits:
		// Retry after up to two rounds' time, at random: long enough
		// for the clients we split with to be done with their cleanup
		// (or for one to have won). All of it leeway: the round's
		// time, on a clock a test moves (see internal/clock), holds
		// the moves made while it was on its way, and is no measure
		// of the others' cleanup.
		_, _, err = w.sleepFor(ctx, w.m.clk.Now(), mrand.N(2*o.took+1))
	default:
		var fresh bool
		if fresh, err = w.listen(ctx); fresh || err != nil {
			// Listening just now: attempt, and so queue, before sleeping.
			return false, err
		}
		var g grant
		if g, err = w.await(ctx, o); err == nil && !g.start.IsZero() {
			return w.acquired(ctx, g, nil)
		}
	}
	return false, err
}

// acquired makes g the caller's, as its kind takes it (see acquirer.take),
// and reports whether it did.
func (w *waiter) acquired(ctx context.Context, g grant, unqueue []bool) (bool, error) {
	ok, err := w.a.take(ctx, w, g, unqueue)
	if ok {
		w.queued = false
	}
	return ok, err
}

// An ask is how an acquire round presents a waiter (see lua/acquire.lua):
// its member of the waiters' queue and the script's flags.
type ask struct {
	member string // "" for TryLock
	nonce  string // in member, when a release may grant us the lock
	flags  string
	// arrival, for a NetRWMutex's waiter: when its call began, in µs of
	// the local clock, its place in every node's queue: the same order on
	// every node of a quorum (see lua/rw_acquire.lua).
	arrival int64
}

func (w *waiter) ask() ask {
	if !w.wait {
		return ask{}
	}
	q := ask{flags: w.flags()}
	if q.flags == "" {
		// Neither joining nor possibly queued (an uncontended attempt):
		// the script needs no member, and nothing is made for one.
		return q
	}
	q.member = w.m.waiterID
	if w.a.ordered() {
		if w.arrival == 0 {
			w.arrival = w.m.clk.Now().UnixMicro()
		}
		q.arrival = w.arrival
	}
	if w.m.grants {
		if w.nonce == "" {
			w.nonce = rand.Text()
		}
		q.nonce = w.nonce
		// The holder last: a release that grants us the lock writes it
		// with the hold (see lua/handon.lua).
		q.member = w.m.waiterID + "+" + w.m.expiryMS + "+" + w.nonce + "+" + w.m.holder
	}
	return q
}

// flags returns the acquire script's flags for the next attempt, as m's
// kind asks for them ("" for TryLock).
func (w *waiter) flags() string {
	if !w.wait {
		return ""
	}
	return w.a.flags(w.listening(), w.turn, w.queued)
}

// await sleeps, after round o found the lock held, until the waiter's
// turn, its connection failing, the holder's TTL (o.ttl, -1 if unknown)
// running out, or ctx's end. A waiter that cannot listen polls instead. If
// the turn came with the lock granted (see lua/handon.lua), it returns the
// grant.
func (w *waiter) await(ctx context.Context, o outcome) (grant, error) {
	ttl := o.ttl
	if !w.listening() {
		_, err := w.sleep(ctx, w.delay.next(ttl))
		return grant{}, err
	}
	// A key without a TTL (not netlock's) is looked at again after an expiry.
	at, leeway := w.m.clk.Now().Add(w.m.cfg.expiry), time.Duration(0)
	if ttl >= 0 {
		// Just past the expiry (Redis expires keys with 1ms resolution),
		// with jitter, so that waiters that attempted together do not
		// attempt together again. The TTL was read during the round, so
		// the key expires by the round's end plus ttl: counted from
		// there, not from now (the round's cleanup took a round trip
		// since). The round's duration and the jitter are leeway: a
		// clock a test moves (see internal/clock) wakes us at the
		// round's start plus ttl, whatever moved while the reply was on
		// its way.
		at = o.start.Add(ttl + time.Millisecond)
		leeway = o.took + mrand.N(ttl/ttlJitter+time.Millisecond)
	}
	payload, woken, err := w.sleepFor(ctx, at, leeway)
	if !woken || err != nil {
		return grant{}, err
	}
	if g, ok := w.a.messageGrant(ctx, w, payload); ok {
		return g, nil
	}
	// Our turn: a release named us (a grant for another call of this
	// NetMutex, or a failed connection, is not our turn, only a reason to
	// look).
	w.turn = payload == w.m.waiterID && !w.deadWatch()
	return grant{}, nil
}

// ttlJitter: a waiter wakes at the holder's TTL plus up to a sixteenth of
// it, at random.
const ttlJitter = 16

// rideOut waits before the next attempt while the nodes do not answer (err
// says why), until they have not answered for the outage window; then it
// returns err. TryLock never rides out.
func (w *waiter) rideOut(ctx context.Context, err error) error {
	if !w.wait {
		return err
	}
	now := w.m.clk.Now()
	if w.down.IsZero() {
		w.down = now
		w.delay.n = 0
	}
	w.downErr = err
	left := w.m.cfg.outage - now.Sub(w.down)
	if left <= 0 {
		return err
	}
	_, err = w.sleep(ctx, min(w.delay.next(-1), left))
	return err
}

// answered records that the nodes answered a round: an outage is over, and
// watches that failed during it may be tried again.
func (w *waiter) answered() {
	if w.down.IsZero() {
		return
	}
	w.down, w.downErr = time.Time{}, nil
	w.delay.n = 0
	clear(w.failed)
}

// ended returns the error of a wait that ctx's end (cause) stopped: the
// lock was held by another (ErrNotObtained), or, if the nodes did not
// answer the last attempt, Redis could not be asked (their error, which
// matches ErrQuorum).
func (w *waiter) ended(cause error) error {
	if w.downErr != nil {
		return unreachable(cause, w.downErr)
	}
	return notObtained(cause)
}

// endedRound returns the error of a wait whose round o ctx ended (see
// ended). If the nodes did not answer o, an error of an earlier round of
// this outage, if any, says more than o's (a connection refused, where
// o's calls were cut short by the deadline).
func (w *waiter) endedRound(o outcome) error {
	if o.down != nil && w.downErr == nil {
		w.downErr = o.down
	}
	return w.ended(o.err)
}

// sleep waits for d, a wake-up, or ctx's end (then it returns ctx's cause
// joined with ErrNotObtained). It reports whether a wake-up ended it. A
// grant that wakes it is left to the next attempt, which finds it.
func (w *waiter) sleep(ctx context.Context, d time.Duration) (woken bool, err error) {
	_, woken, err = w.sleepFor(ctx, w.m.clk.Now().Add(d), 0)
	return woken, err
}

// sleepFor is sleep until at, or as late as leeway after (a clock moved by
// a test, see internal/clock, ends it at at), returning the wake-up's
// payload too.
func (w *waiter) sleepFor(ctx context.Context, at time.Time, leeway time.Duration) (payload string, woken bool, err error) {
	clk := w.m.clk
	if w.timer == nil {
		w.timer = clk.NewTimerAt(at, leeway)
	} else {
		clk.ResetAt(w.timer, at, leeway)
	}
	select {
	case <-ctx.Done():
		return "", false, w.ended(context.Cause(ctx))
	case <-w.timer.C:
		return "", false, nil
	case payload = <-w.wake: // nil, blocking for ever, while not listening
		clk.Stop(w.timer)
		return payload, true, nil
	}
}

// drain forgets a wake-up signalled before now.
func (w *waiter) drain() {
	select {
	case <-w.wake:
	default:
	}
}

// yield makes an acquire that starts right after this NetMutex's own
// release let the clients that were waiting for that release go first: it
// waits until m.yieldUntil, or until a release names us, or until ctx ends.
// It listens first, as every wait must.
func (w *waiter) yield(ctx context.Context) error {
	m := w.m
	if m.yieldLeft() <= 0 {
		return nil
	}
	if _, err := w.listen(ctx); err != nil {
		return err
	}
	d := m.yieldLeft()
	if d <= 0 || !w.listening() {
		return nil
	}
	_, err := w.sleep(ctx, d)
	return err
}

// Bounds of the head start an Unlock gives the clients its release woke.
const (
	minYield = 200 * time.Microsecond
	maxYield = 5 * time.Millisecond
)

// yieldLeft returns how long an acquire starting now must yield.
func (m *engine) yieldLeft() time.Duration {
	return time.Duration(m.yieldUntil.Load()) - m.clk.Since(m.epoch)
}

// done ends the waiter: its watches stop, and if the call failed, it leaves
// the waiters' queues it may be in, passing on a turn that came too late.
// It reports whether the caller holds after all (see acquirer.leave).
func (w *waiter) done(ctx context.Context, ok bool) (held bool) {
	if !ok && w.nonce != "" {
		w.m.mu.Lock()
		w.m.gaveUpLocked(w.nonce)
		w.m.mu.Unlock()
	}
	for _, wt := range w.watches {
		if wt != nil {
			wt.stop()
		}
	}
	if w.timer != nil {
		w.m.clk.Stop(w.timer)
	}
	return !ok && w.queued && w.a.leave(ctx, w.ask().member, nil)
}

// backoff is the retry delay of a waiter that polls or rides out an outage.
type backoff struct {
	min, max time.Duration
	n        int // failed attempts so far
}

// next returns the wait before the next attempt: a random duration between
// min and a ceiling that doubles with each attempt up to max (jitter keeps
// waiters that started together from retrying together). It is capped by
// busy, the holder's remaining TTL when known (busy >= 0): once the key has
// expired there is nothing left to wait for.
func (b *backoff) next(busy time.Duration) time.Duration {
	ceiling := b.max
	if b.n < 20 && b.min < b.max>>b.n { // then min<<n < max: no overflow
		ceiling = b.min << b.n
	}
	b.n++
	d := b.min + mrand.N(ceiling-b.min+1)
	if busy >= 0 && d > busy {
		// Just past the expiry: Redis expires keys with 1ms resolution.
		// (Jitter below both min and d-busy: busy plus it cannot overflow.)
		d = busy + mrand.N(min(b.min, d-busy))
	}
	return d
}
