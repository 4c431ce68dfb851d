package netlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// leave takes our waiter off the queue in Redis, and takes back a grant
// made to its call that it did not take in, under a context detached from
// ctx's cancellation. Best effort: a place left behind expires, and a grant
// left behind is dropped by the process's next call (see
// lua/sem_acquire.lua).
//
// owed: only the leave owed after waiters gave up while another was queued
// (see Semaphore.owed), if no waiter of ours is queued now (one that is
// takes the place over). w: the first waiter, whose wait ends; it is taken
// off the local queue here, unless a release handed it its permits
// meanwhile (see handOnLocked): then nothing is left (the release saw to
// the place), and leave reports handed: w holds.
func (s *Semaphore) leave(ctx context.Context, owed bool, w *localWaiter) (handed bool) {
	m := s.m
	s.op.Lock()
	defer s.op.Unlock()
	m.mu.Lock()
	if w != nil {
		if w.handed {
			m.mu.Unlock()
			return true
		}
		// Out of line under the m.mu of the look at handed: no release
		// hands w anything from here on (a waiter that gave up never
		// holds, and no permits are handed to nobody).
		m.unqueueLocked(w)
	}
	if owed && (!s.owed || m.owned) {
		m.mu.Unlock()
		return false
	}
	if m.owned {
		// Another waiter of ours is first now: it keeps the place (its
		// attempt drops the grant, if any). If it gives up too, the last
		// of ours leaves, with our nonce.
		if s.nonce != "" {
			s.left = s.nonce
		}
		s.nonce, s.owed = "", true
		m.mu.Unlock()
		return false
	}
	m.mu.Unlock()
	s.leaveLocked(ctx)
	return false
}

// leaveLocked takes the process's place in Redis off the queue, with the
// grant made under the nonce of its last waiting call, if any (see leave).
// The caller holds s.op, not m.mu.
func (s *Semaphore) leaveLocked(ctx context.Context) {
	m := s.m
	s.m.mu.Lock()
	value, nonce := s.value, s.nonce
	if nonce == "" {
		nonce = s.left
	}
	s.nonce, s.entry, s.left, s.owed, s.placed = "", "", "", false, false
	s.m.mu.Unlock()
	if nonce == "" {
		value = ""
	}
	sc, keys, args := s.leaveCall(value, nonce)
	m.fanout(context.WithoutCancel(ctx), sc, keys, args, nil)
}

// keysOf returns the keys of a call for the lease value: the semaphore's,
// and value's tombstone (see lua/sem_acquire.lua); the semaphore's alone
// for none ("").
func (s *Semaphore) keysOf(value string) []string {
	if value == "" {
		return s.keys
	}
	return append(s.keys[:len(s.keys):len(s.keys)], keyspace.Tomb(s.keys[0], value))
}

// leaveCall returns lua/sem_leave.lua's call for the process's place, with
// the grant made to its lease value under nonce ("" and "": none).
func (s *Semaphore) leaveCall(value, nonce string) (*Script, []string, []string) {
	return semLeaveScript, s.keysOf(value), []string{s.m.waiterID + ":" + value + ":" + nonce + ":" + s.m.expiryMS + ":" + s.m.tombMS}
}

// adopt takes in the permits a release granted w, by its message, under
// nonce on the lease value, and reports whether it did. The grant was made after
// w's first attempt under the nonce began (s.joined), so a new lease is
// valid from then. It is not taken in (the next attempt finds it in Redis,
// under the nonce, and takes it with a deadline of its own) when the
// process's lease is no longer the one the grant went to, when Redis may
// hold a count we do not know (dirty), or when a new lease would leave
// less than an extend interval.
func (s *Semaphore) adopt(w *localWaiter, nonce, value string) bool {
	m := s.m
	s.op.Lock()
	defer s.op.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if w.handed {
		return true // handed its permits by a release (see handOnLocked): the grant is nobody's
	}
	s.entry = "" // a grant changed our entry (see lua/sem_wake.lua, holdPlace)
	s.retireLostLocked()
	if nonce == "" || nonce != s.nonce || value != s.value || s.dirty || s.fold != "" {
		return false
	}
	if s.lease == nil {
		until := s.joined.Add(m.cfg.expiry - m.driftTerm)
		if m.clk.Until(until) < m.cfg.expiry/extendsPerExpiry {
			return false
		}
		s.lease = newHold(m, grant{value: value, start: s.joined, until: until})
	}
	s.held += w.n
	s.fold, s.nonce = nonce, ""
	m.handoffs = 0 // permits from Redis: the hand-ons start again
	m.unqueueLocked(w)
	return true
}

// What one attempt came to.
type semResult struct {
	kind      semVerdict
	look      time.Duration // semRefused: when to look again at the latest
	start     time.Time     // semRefused: when the attempt began
	took      time.Duration // semRefused: how long it took; look counts from its end
	err       error         // semFailed
	permanent bool          // semFailed: retrying cannot change the answer
}

type semVerdict int

const (
	semGranted semVerdict = iota
	semRefused
	semRetry  // our lease was found lost; attempt again, for a new lease
	semFailed // no answer, or an error
)

// maxBatch bounds the waiters of a process one call asks for (see
// lua/sem_acquire.lua).
const maxBatch = 8

// attempt asks Redis once for w's permits on the process's lease (a new
// lease if it holds none), and for those of the waiters after w in the
// local queue, which get in with it when they fit and came before every
// other process's waiter. w is the first of the local queue, or, for
// TryAcquire (try), a waiter of its own, not queued and without a place.
func (s *Semaphore) attempt(ctx context.Context, w *localWaiter, try bool) semResult {
	s.op.Lock()
	defer s.op.Unlock()
	c, ok := s.prepare(w, try)
	if !ok {
		return semResult{kind: semRefused}
	}
	if c.handed {
		return semResult{kind: semGranted} // by a release, while w was not in a call
	}
	callCtx := ctx
	if !try {
		// A waiter's call is not cut short by its ctx (the node timeout
		// bounds it): one cut short may still reach Redis after the leave
		// that follows it and queue a place nobody keeps. wait looks at
		// ctx once it returns.
		callCtx = context.WithoutCancel(ctx)
	}
	measured := s.m.clk.Measure()
	start := s.m.clk.Now()
	r := s.m.fanout(callCtx, semAcquireScript, s.keysOf(c.value), []string{c.arg(s)}, nil)[0]
	took := s.m.clk.Since(start)
	measured()
	if r.err != nil {
		return s.callFailed(ctx, c.value, r)
	}
	s.m.mu.Lock()
	s.calling = nil
	s.dirty = false // the count Redis holds is one we sent
	if r.vals[0] != semAcquireSize && s.fold == c.fold {
		s.fold = "" // folded (or gone with the lease)
	}
	switch r.vals[0] {
	case semAcquireGranted:
		return s.granted(ctx, c, r.vals[1], start, start.Add(s.m.cfg.expiry-took-s.m.driftTerm))
	case semAcquireGone:
		// Our lease expired in Redis: its permits are gone.
		lease := s.lease
		s.m.mu.Unlock()
		if lease != nil {
			lease.lose()
			s.m.mu.Lock()
			s.retireLostLocked()
			s.m.mu.Unlock()
		}
		return semResult{kind: semRetry}
	case semAcquireSize:
		s.m.mu.Unlock()
		return semResult{kind: semFailed, permanent: true, err: &wrapError{
			msg: fmt.Sprintf("netlock: semaphore %q: size %d here, but its holders and waiters in Redis use %d", s.m.name, s.size, r.vals[1]),
			err: ErrSizeMismatch}}
	case semAcquireLate: // a later call was applied: not this one's reply
		s.m.mu.Unlock()
		return semResult{kind: semRetry}
	}
	s.entry = c.entry // written, or unchanged
	s.m.mu.Unlock()
	look := time.Duration(r.vals[2]) * time.Millisecond
	if look <= 0 || look > s.m.cfg.expiry {
		look = s.m.cfg.expiry
	}
	return semResult{kind: semRefused, look: look, start: start, took: took}
}

// A semCall is one call of lua/sem_acquire.lua, as attempt makes it.
type semCall struct {
	value string // the lease's
	grow  bool   // the lease is held: the call adds to it
	base  int64  // the permits the lease holds before the call
	seq   int64
	// fold, nonce: see Semaphore.
	fold, nonce string
	try         bool           // TryAcquire: no member, no place
	batch       []*localWaiter // w, then the local waiters after it that the call asks for
	entry       string         // what the waiter's entry says after the call (see Semaphore.entry)
	flags       string
	handed      bool // no call: a release handed w its permits (see handOnLocked)
}

// prepare makes the call attempt sends for w, and marks w as in a call
// (see Semaphore.calling), unless a release handed w its permits (handed).
// It reports false when a TryAcquire (try) must not be made: a waiter of ours came meanwhile
// (TryAcquire fails while one waits), whose nonce the call would carry, so
// that it could take the permits a release set aside for it. The caller
// holds s.op.
func (s *Semaphore) prepare(w *localWaiter, try bool) (semCall, bool) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if w.handed {
		return semCall{handed: true}, true
	}
	if try && s.nonce != "" {
		return semCall{}, false
	}
	s.calling = w
	s.retireLostLocked()
	if s.value == "" {
		// 128 random bits, and the holder (the lease is a member of a
		// sorted set, with nothing beside it).
		s.value = rand.Text() + keyspace.LeaseSuffix(s.m.holder)
	}
	s.seq++
	if !try && s.grants && s.nonce == "" {
		s.nonce, s.joined = rand.Text(), s.m.clk.Now()
	}
	s.placed = s.placed || !try
	c := semCall{value: s.value, grow: s.lease != nil, base: s.held, seq: s.seq, fold: s.fold, nonce: s.nonce, try: try}
	c.batch = []*localWaiter{w}
	if !try {
		// w is the first, m.first: the waiters after it are m's queue.
		for _, q := range s.m.waiters {
			if len(c.batch) == maxBatch {
				break
			}
			if q != w {
				c.batch = append(c.batch, q)
			}
		}
	}
	if c.grow {
		c.flags = "g"
	}
	if !try {
		// The waiter's entry in Redis is written when it changed (see
		// lua/sem_acquire.lua); entry is what it says.
		next := int64(0)
		if len(c.batch) > 1 {
			next = c.batch[1].arrival
		}
		c.entry = fmt.Sprint(w.n, c.value, c.nonce, c.grow, next, w.arrival)
		if c.entry != s.entry {
			c.flags += "w"
		}
	}
	return c, true
}

// arg returns the call's argument to lua/sem_acquire.lua.
func (c *semCall) arg(s *Semaphore) string {
	m := s.m
	member := m.waiterID
	if c.try {
		member = ""
	}
	var b strings.Builder
	b.WriteString(c.value + ":" + strconv.FormatInt(c.base, 10) + ":" + strconv.FormatInt(c.seq, 10) + ":" + strconv.FormatInt(s.size, 10) + ":" +
		m.expiryMS + ":" + member + ":" + c.flags + ":" + s.placeMS + ":" + m.tombMS + ":" + c.fold + ":" + c.nonce + ":")
	for i, q := range c.batch {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(q.n, 10) + "@" + strconv.FormatInt(q.arrival, 10))
	}
	return b.String()
}

// callFailed is what a call of the lease value that got no answer (r)
// comes to. The caller holds s.op.
func (s *Semaphore) callFailed(ctx context.Context, value string, r nodeReply) semResult {
	s.m.mu.Lock()
	s.calling = nil
	s.entry = ""
	s.m.mu.Unlock()
	switch {
	case errors.Is(r.err, ErrNotReplicated):
		// Granted on the node, not on enough of its replicas: undone
		// at once (a new lease ended, a grown one back to its count).
		s.m.mu.Lock()
		lease, total := s.lease, s.held
		s.m.mu.Unlock()
		s.send(ctx, value, total, lease)
	case !r.unsent && !r.over():
		s.m.mu.Lock()
		s.dirty = true // it may have been granted
		s.fixLaterLocked()
		s.m.mu.Unlock()
	}
	return semResult{kind: semFailed, err: &quorumError{nodes: 1, need: 1, errs: []error{r.err}}, permanent: r.permanent}
}

// granted takes in a call's grant of the permits of the first k waiters of
// its batch, on the lease, whose local deadline is now until (the call
// began at start). The caller holds s.op and m.mu; granted returns without
// m.mu.
func (s *Semaphore) granted(ctx context.Context, c semCall, k int64, start, until time.Time) semResult {
	batch := c.batch[:min(int(k), len(c.batch))]
	var sum int64
	for _, q := range batch {
		sum += q.n
	}
	lease := s.lease
	switch {
	case lease == nil:
		lease = newHold(s.m, grant{value: c.value, start: start, until: until})
		s.lease = lease
	case !lease.moveUntil(until):
		// Lost here as the grant came back: the lease's permits, the new
		// ones too, are given up (the lease is no longer extended).
		s.retireLostLocked()
		s.m.mu.Unlock()
		return semResult{kind: semRetry}
	}
	// The waiters after the first that the call took in: theirs, unless
	// they gave up meanwhile; what they asked for is then given back.
	var surplus int64
	for _, q := range batch[1:] {
		if s.m.inLineLocked(q) {
			s.m.handLocked(q, lease)
		} else {
			surplus += q.n
		}
	}
	s.held += sum - surplus
	s.m.handoffs = 0 // permits from Redis: the hand-ons start again
	if !c.try {
		s.nonce, s.entry = "", "" // the first waiter's call is over
		s.m.unqueueLocked(c.batch[0])
		if len(batch) == len(c.batch) {
			// Our place is off the queue, and a grant under a nonce left
			// behind was dropped (see lua/sem_acquire.lua, holdPlace).
			s.placed, s.owed, s.left = false, false, ""
		}
	}
	total := s.held
	s.m.mu.Unlock()
	if surplus > 0 {
		s.send(ctx, c.value, total, lease)
	}
	return semResult{kind: semGranted}
}

// retireLostLocked retires the lease if it was lost: its permits become
// stale (given back by Release without a round trip), and the next acquire
// takes a new lease. The caller holds m.mu.
func (s *Semaphore) retireLostLocked() {
	if s.lease == nil {
		return
	}
	if _, held := s.lease.deadline(); held {
		return
	}
	// A lost hold's watchdog is stopped already (see hold.expire, lose).
	s.stale += s.held
	s.held, s.lease, s.value, s.dirty, s.fold = 0, nil, "", false, ""
}

// giveBackLocked gives n permits of the lease back in Redis (the last ends
// it). The caller holds s.op and m.mu; giveBackLocked returns without m.mu.
func (s *Semaphore) giveBackLocked(ctx context.Context, n int64) error {
	s.held -= n
	value, total, lease := s.value, s.held, s.lease
	if total == 0 {
		s.lease = nil
	}
	s.m.mu.Unlock()
	if total == 0 && lease.end() {
		// Lost just now: its permits came back in Redis as it expired.
		s.m.mu.Lock()
		if s.value == value {
			s.value, s.dirty = "", false
		}
		s.m.mu.Unlock()
		return ErrLockLost
	}
	return s.send(ctx, value, total, lease)
}

// handOnLocked hands n permits a release gives back on to this process's
// first waiters, by its kind's local rule (semLease.admitLocked): in
// their order, each while they cover its whole request (a later, smaller
// waiter never passes an earlier one) and the lease may serve it (the
// hand-ons in a row within WithLocalHandoffs, the lease well within its
// validity): they stay on the lease, counted in held, without a round trip. It returns the permits left to give back in Redis,
// and whether the process's place in Redis must be left: the last of its
// waiters got in by hand-on, so nobody of ours takes the place over. The
// caller holds m.mu, and s.op (so that the first waiter has no call in
// flight), or has seen that the first waiter has none (handOnAllLocked).
func (s *Semaphore) handOnLocked(n int64) (rest int64, leave bool) {
	n, handed := s.kind.admitLocked(s.m, s.lease, n)
	if handed > 0 {
		// The first waiter's call is over, as when it gives up (see
		// leave): a grant made under its nonce is nobody's (adopt refuses
		// it, and the next call or leave drops it in Redis); the next
		// waiter of ours, if any, takes the place over with its call.
		if s.nonce != "" {
			s.left = s.nonce
		}
		s.nonce, s.entry = "", ""
	}
	if handed == 0 || s.m.owned {
		// The next waiter, first now, takes the place over: it makes a
		// call before it waits, or is handed on to, or leaves as it gives
		// up (see semLease.leftLocked).
		return n, false
	}
	return n, s.placed || s.owed || s.left != ""
}

// handOnAllLocked hands all n permits on, as handOnLocked does, when that
// takes no call to Redis: they cover the requests of the first waiters
// exactly, none of which is in a call (only the first can be: see
// Semaphore.calling), and the process's place needs no leave. It reports
// whether it did. Without s.op: the permits stay on the lease, so the count
// that calls under s.op send does not change, and a waiter looks at
// handed under m.mu before each call, adopt and leave. The caller holds
// m.mu.
func (s *Semaphore) handOnAllLocked(n int64) bool {
	m := s.m
	s.retireLostLocked()
	if s.stale > 0 || n > s.held || !m.owned || m.first == s.calling || s.lease == nil {
		return false
	}
	k, sum := s.kind.fitsLocked(m, n)
	if sum != n || k == 0 || m.handoffs+k > m.cfg.handoffs || !m.mayHandOffLocked(s.lease) ||
		(k == 1+len(m.waiters) && (s.placed || s.owed || s.left != "")) {
		return false
	}
	s.handOnLocked(n)
	return true
}

// send tells Redis that the lease value holds total permits now (0 ends
// it). The caller holds s.op. lease is value's hold (ended when total is 0).
func (s *Semaphore) send(ctx context.Context, value string, total int64, lease *hold) error {
	m := s.m
	s.m.mu.Lock()
	s.seq++
	seq, fold, nonce := s.seq, s.fold, s.nonce
	s.m.mu.Unlock()
	arg := value + ":" + strconv.FormatInt(total, 10) + ":" + strconv.FormatInt(seq, 10) + ":" + fold + ":" + nonce + ":" + m.expiryMS + ":" + m.tombMS
	r := m.fanout(context.WithoutCancel(ctx), semReleaseScript, s.keysOf(value), []string{arg}, nil)[0]
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if r.err != nil {
		// Sent again in the background, unless nothing could take it: a
		// closed client, a server gone, an error reply that sending again
		// cannot change (a count the lease keeps expires with it).
		if s.value == value && !r.unsent {
			if r.over() {
				s.dirty = false // nothing will take it: resend stops
			} else {
				s.dirty = true
				s.fixLaterLocked()
			}
		}
		return &quorumError{nodes: 1, need: 1, errs: []error{r.err}}
	}
	if s.value == value {
		s.dirty = false
		if s.fold == fold {
			s.fold = "" // folded (or gone with the lease)
		}
		if total == 0 {
			s.value = ""
		}
	}
	if r.vals[0] == semReleaseGone {
		// Gone: the lease expired in Redis. (semReleaseLate: a later call
		// was applied, this one's reply is not news.)
		if total > 0 {
			s.m.mu.Unlock()
			lease.lose()
			s.m.mu.Lock()
			s.retireLostLocked()
		}
		return ErrLockLost
	}
	return nil
}

// fixLaterLocked queues a resend of the lease's count in the reaper,
// unless one is queued. The caller holds m.mu.
func (s *Semaphore) fixLaterLocked() {
	if !s.fixing {
		s.fixing = true
		s.m.reapAgain(&semResend{s: s, giveUp: s.m.clk.Now().Add(tombstoneExpiries * s.m.cfg.expiry)})
	}
}

// A semResend is the reaper's redelivery of a Semaphore lease's count
// while a call's reply was lost (see resend).
type semResend struct {
	s      *Semaphore
	giveUp time.Time
}

func (r *semResend) deliver(*engine) bool { return r.s.resend(r.giveUp) }

// resend sends the lease's count again if a call's reply was lost
// (dirty), and reports whether it is over: Redis answered (and no reply
// was lost since), the lease ended, an error said it never will (a closed
// client), or giveUp, ten expiries after the loss, has passed (a lease
// held all that time whose count Redis could not be told keeps a few
// permits too many out until it ends).
func (s *Semaphore) resend(giveUp time.Time) bool {
	s.op.Lock()
	defer s.op.Unlock()
	s.m.mu.Lock()
	s.retireLostLocked()
	if !s.dirty || s.value == "" || s.m.clk.Now().After(giveUp) {
		s.dirty, s.fixing = false, false
		s.m.mu.Unlock()
		return true
	}
	value, total, lease := s.value, s.held, s.lease
	s.m.mu.Unlock()
	if lease == nil {
		total = 0
	}
	s.send(context.Background(), value, total, lease)
	return false
}

// Reply statuses of lua/sem_acquire.lua, read by attempt.
const (
	semAcquireGranted = 1  // granted to the first k of the batch
	semAcquireRefused = -1 // not now
	semAcquireLate    = -2 // a later call of the process was applied
	semAcquireGone    = -3 // our lease is gone: it was lost
	semAcquireSize    = -4 // the holders and waiters use another size
)

// Reply statuses of lua/sem_release.lua, read by send.
const (
	semReleaseDone = 1  // released
	semReleaseGone = 0  // the lease is gone: it expired
	semReleaseLate = -2 // a later call of the process was applied
)
