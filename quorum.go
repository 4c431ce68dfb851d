package netlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A grant is a successful acquire round.
type grant struct {
	value        string    // our lock value, fresh for this round
	tomb         string    // value's tombstone key, "" if not known (see engine.tomb)
	token        uint64    // fencing token (0 with fencing off)
	start, until time.Time // when the round began; the hold's local deadline
	// writerWaits, for a NetRWMutex's read lease: a node said a writer
	// waits (see lua/rw_acquire.lua).
	writerWaits bool // nonce, for a Semaphore's grant by message: the waiting call's join
	// it answers (see lua/sem_wake.lua).
	nonce string
}

// An outcome is what one acquire round came to.
type outcome struct {
	kind  outcomeKind
	grant grant         // acquired
	ttl   time.Duration // busy: the shortest remaining TTL of a holder seen, -1 if unknown
	start time.Time     // when the round began: ttl was read within took after it
	took  time.Duration // how long the round took
	err   error         // down, failed, ended
	// unqueue lists, after an acquired round, the nodes that did not grant:
	// their waiters' queues may still hold our id.
	unqueue []bool
	// rejoin: busy, and our member is no longer queued; it must join
	// again under a fresh nonce (see lua/acquire.lua).
	rejoin bool
	// down, ended: too few nodes answered, for reasons other than ctx's
	// end (an error matching ErrQuorum); err is ctx's cause.
	down error
}

type outcomeKind int

const (
	acquired outcomeKind = iota
	busy                 // held by another client
	ballot               // free on a quorum, but our fencing ballot was refused: retry at once
	split                // some nodes granted, not a quorum: clients attempting together split the votes
	down                 // too few nodes answered, for reasons that may pass (an outage)
	failed               // too few nodes answered, and one's answer will not change (WRONGTYPE, NOPERM)
	ended                // ctx ended
)

// acquireRound makes one attempt to acquire the lock on every node, as the
// waiters' queue member q (see waiter.ask; zero for TryLock). On success the outcome carries the grant: value,
// token and the hold's local deadline. On contention it is busy, with the
// shortest remaining TTL of a holder seen, which bounds how long waiting can
// be useful; ballot if the key is free on a quorum but our ballot was
// refused; split if the votes split.
//
// On any failure it releases the value on every node that did not answer
// definitively "not taken", under a context detached from ctx: a node that
// granted, or that may yet apply our SET without our seeing the reply, must
// not keep the key until its TTL runs out. The release leaves a tombstone
// where the key is not ours, so a late SET is refused whenever it arrives.
func (m *engine) acquireRound(ctx context.Context, q ask) outcome {
	// A fresh value every round: a request of an earlier round that is still
	// on its way to a stalled node can then only meet its own tombstone.
	value, tomb := m.freshValue()
	proposal := "0" // single node: the script increments its counter
	if len(m.nodes) > 1 {
		proposal = strconv.FormatUint(m.seen.Load()+1, 10)
	}
	// The monotonic start is taken before anything is sent: each node's TTL
	// starts after it, so start+validity is before any node's key expires
	// (up to the drift allowance).
	measured := m.clk.Measure()
	start := m.clk.Now()
	s, keys, args := m.kind.acquireCall(value, m.tomb(value, tomb), proposal, q)
	replies := m.fanout(ctx, s, keys, args, nil)
	took := m.clk.Since(start)
	measured()
	validity := m.cfg.expiry - took - m.driftTerm

	// Each node's reply as its kind reads it; a plain lock's kept off the
	// heap (out of v, whose errors escape with an outcome).
	var one [1]acquireReply
	reads := one[:]
	if len(replies) > 1 {
		reads = make([]acquireReply, len(replies))
	}
	var v votes
	m.tally(&v, reads, replies)
	if v.handed > 0 && q.nonce != "" && len(replies) == 1 {
		// A release granted us the lock; this round found it and
		// refreshed its TTL (after start): it is ours, under the value
		// the release made. (Our fresh value was never written: a
		// cleanup releases this one, and gives the turn on.)
		value, tomb = m.grantValue(q.nonce, strconv.FormatInt(v.handed, 10)), ""
	}
	if validity > 0 && ctxEnded(ctx) == nil {
		if token, ok := v.quorum(reads, m.quorum); ok {
			g := grant{value: value, tomb: tomb, token: uint64(token), start: start, until: start.Add(validity), writerWaits: v.writerWaits}
			return outcome{kind: acquired, grant: g, took: took, unqueue: v.refused()}
		}
	}
	m.releaseBy(ctx, value, tomb, v.cleanup, v.nGranted > 0)
	o := m.lostRound(ctx, &v, took)
	o.start = start
	return o
}

// quorumAcquirer is the acquirer of every kind a quorum round takes (see
// acquireRound): its flags and reply are the kind's (m.kind), and a hold
// taken is m's.
type quorumAcquirer struct {
	m *engine
}

func (a quorumAcquirer) flags(listening, turn, queued bool) string {
	return a.m.kind.waitFlags(listening, turn, queued)
}

func (a quorumAcquirer) ordered() bool { return a.m.opt.ordered }

func (a quorumAcquirer) round(ctx context.Context, q ask) outcome { return a.m.acquireRound(ctx, q) }

// take makes g m's hold, if m's client can keep it (see keeps). Nodes that
// did not grant (unqueue) may keep us in their waiters' queues: we leave
// them.
func (a quorumAcquirer) take(ctx context.Context, w *waiter, g grant, unqueue []bool) (bool, error) {
	if err := w.keeps(ctx, g); err != nil {
		return false, err
	}
	if w.queued && unqueue != nil {
		a.m.leave(ctx, w.ask().member, unqueue)
	}
	a.m.setHold(newHold(a.m, g))
	return true, nil
}

func (a quorumAcquirer) leave(ctx context.Context, member string, targets []bool) bool {
	a.m.leave(ctx, member, targets)
	return false
}

func (a quorumAcquirer) leaveCall(member string) (*Script, []string, []string) {
	return a.m.kind.leaveCall(member)
}

func (a quorumAcquirer) passOnCall(g grant) (*Script, []string, []string) {
	return a.m.kind.releaseCall(g.value, a.m.tomb(g.value, ""))
}

// messageGrant returns the hold a release granted w, from its message
// "g:<nonce>:<n>:<token>". Its key's TTL started when the release ran, after
// our member was added under this nonce, so after the first round that
// could add it began (w.joined): the local deadline is the validity counted
// from then. A member is added once per nonce (lua/acquire.lua), so a late
// message of a grant since lost cannot name the current join. A message
// that leaves less than an extend interval, which the watchdog could not
// keep, is not taken as a grant: the next attempt adopts the key, renewing
// its TTL from a start of its own. A grant naming a nonce a waiter of m
// gave up (a join of an earlier call, left behind by a leave that failed,
// or one we were told to leave) is released at once, so that the lock goes
// on; one naming the nonce of a waiter that succeeded is (or was) m's
// hold, its message late: left alone.
func (a quorumAcquirer) messageGrant(ctx context.Context, w *waiter, payload string) (grant, bool) {
	nonce, n, token, ok := parseGrant(payload)
	if !ok {
		return grant{}, false
	}
	m := w.m
	value := m.grantValue(nonce, n)
	if nonce != w.nonce {
		if m.gaveUpOn(nonce) {
			m.release(detached(ctx), value, "", nil, true) // granted: held on the node
		}
		return grant{}, false
	}
	until := w.joined.Add(m.cfg.expiry - m.driftTerm)
	if w.joined.IsZero() || m.clk.Until(until) < m.cfg.expiry/extendsPerExpiry {
		return grant{}, false
	}
	if w.deadWatch() {
		// The connection the message came on has failed since, maybe
		// with its client, closed (see Listener): not taken here, as the
		// client may not keep it. The next attempt adopts it if it can.
		return grant{}, false
	}
	g := grant{value: value, token: token, start: w.joined, until: until}
	if m.opt.granted != nil {
		m.opt.granted(&g)
	}
	return g, true
}

// votes is what the nodes answered one acquire round.
type votes struct {
	granted []bool // the node granted
	cleanup []bool // the node may hold our value
	// handed: a release granted us the hold, under "<nonce>.<handed>".
	handed                     int64
	nGranted, fenced, answered int
	// silent counts the nodes that were sent the call and did not answer
	// (an error, or no reply by ctx's end), of which cut those whose call
	// ctx's cancellation cut short (see lostRound).
	silent, cut       int
	permanent, rejoin bool
	writerWaits       bool          // a granting node said a writer waits
	ttl               time.Duration // the shortest holder's TTL seen, -1 if none
	errs              []error
}

// tally reads the nodes' replies to an acquire round into v, and each
// node's reply as its kind reads it into reads (zero where it did not
// answer).
func (m *engine) tally(v *votes, reads []acquireReply, replies []nodeReply) {
	marks := make([]bool, 2*len(replies)) // one allocation for both
	v.granted = marks[:len(replies):len(replies)]
	v.cleanup = marks[len(replies):]
	v.ttl = -1
	for i, r := range replies {
		if r.err != nil {
			v.errs = append(v.errs, r.err)
			v.permanent = v.permanent || r.permanent
			v.cleanup[i] = !r.unsent
			if !r.unsent {
				v.silent++
				if errors.Is(r.err, context.Canceled) {
					v.cut++
				}
			}
			continue
		}
		a := m.opt.reply(r.vals)
		reads[i] = a
		v.answered++
		m.learn(a.counter)
		switch a.status {
		case acquireHeld:
			v.granted[i], v.cleanup[i] = true, true
			v.nGranted++
			v.handed = max(v.handed, a.granted)
			v.writerWaits = v.writerWaits || a.writerWaits
		case acquireBusy:
			v.rejoin = v.rejoin || a.rejoin
			if a.pttl >= 0 && (v.ttl < 0 || a.pttl < v.ttl) {
				v.ttl = a.pttl
			}
		case acquireFenced:
			v.fenced++
		case acquireLate: // cannot happen for a fresh value; nothing to undo
		default:
			v.errs = append(v.errs, nodeError(i, fmt.Errorf("acquire script: unknown status %d", a.status)))
			v.permanent = true
			v.cleanup[i] = true
			v.answered--
		}
	}
}

// quorum returns the token granted by at least need nodes (reads: their
// replies): a hold needs a quorum granting the same token.
func (v *votes) quorum(reads []acquireReply, need int) (token int64, ok bool) {
	for i := range reads {
		if !v.granted[i] {
			continue
		}
		n := 0
		for j := i; j < len(reads); j++ {
			if v.granted[j] && reads[j].counter == reads[i].counter {
				n++
			}
		}
		if n >= need {
			return reads[i].counter, true
		}
	}
	return 0, false
}

// refused returns, after an acquired round, the nodes that did not grant
// (their waiters' queues may still hold our id), nil if every node did.
func (v *votes) refused() []bool {
	if v.nGranted == len(v.granted) {
		return nil
	}
	for j := range v.granted {
		v.granted[j] = !v.granted[j]
	}
	return v.granted
}

// lostRound returns what a round that did not acquire came to.
func (m *engine) lostRound(ctx context.Context, v *votes, took time.Duration) outcome {
	switch err := ctxEnded(ctx); {
	case err != nil:
		o := outcome{kind: ended, err: err, took: took}
		// So many nodes were asked and did not answer that no quorum
		// could: Redis could not be asked, which is not a lock held by
		// another. A node whose answer did not come by ctx's deadline
		// counts (it could not answer within the caller's time); one whose
		// call ctx's cancellation cut short does not (a cancellation says
		// nothing of Redis), nor one this process's own crowd of calls
		// kept from being sent (see call).
		if v.silent-v.cut > len(m.nodes)-m.quorum {
			o.down = &quorumError{nodes: len(m.nodes), answered: v.answered, need: m.quorum, errs: v.errs}
		}
		return o
	case v.answered < m.quorum:
		kind := down
		if v.permanent {
			kind = failed
		}
		return outcome{kind: kind, err: &quorumError{nodes: len(m.nodes), answered: v.answered, need: m.quorum, errs: v.errs}, took: took}
	}
	if v.fenced > 0 && v.nGranted+v.fenced >= m.quorum {
		// The nodes where the key is free make a quorum: we lost only on
		// ballots. We have now learned the higher counters: a retry at once
		// proposes above them.
		return outcome{kind: ballot, ttl: -1, took: took}
	}
	if v.nGranted > 0 {
		// Some nodes granted, not a quorum: other clients attempting at the
		// same moment split the votes.
		return outcome{kind: split, ttl: v.ttl, took: took}
	}
	return outcome{kind: busy, ttl: v.ttl, took: took, rejoin: v.rejoin}
}

// learn records a fence counter seen on a node, so the next ballot is above
// it.
func (m *engine) learn(counter int64) {
	for {
		seen := m.seen.Load()
		if uint64(counter) <= seen || m.seen.CompareAndSwap(seen, uint64(counter)) {
			return
		}
	}
}

// releaseBy releases value (whose tombstone key is tomb, "" to derive it)
// on the targeted nodes, under a context that ctx's cancellation does not
// reach but that ends a moment after ctx's deadline (see cleanupBound):
// the caller returns then, and what is not answered by then the reaper
// delivers in the background, so that the key goes anyway. held: some node
// granted the acquire (see release).
func (m *engine) releaseBy(ctx context.Context, value, tomb string, targets []bool, held bool) {
	any := false
	for _, t := range targets {
		any = any || t
	}
	if any {
		cctx, cancel := cleanupBound(ctx)
		m.release(cctx, value, tomb, targets, held)
		cancel()
	}
}

// freshValue returns a fresh lock value and its tombstone key (see
// keys.tomb), in one allocation: the value, 128 random bits written as
// rand.Text writes them, is the tail of the key.
func (m *engine) freshValue() (value, tomb string) {
	var text [26]byte // ⌈log₃₂ 2¹²⁸⌉ characters, as rand.Text
	rand.Read(text[:])
	for i, c := range text {
		text[i] = base32Alphabet[c%32]
	}
	var b strings.Builder
	b.Grow(len(m.tombPrefix) + len(text) + len(m.valueSuffix))
	b.WriteString(m.tombPrefix)
	b.Write(text[:])
	b.WriteString(m.valueSuffix)
	tomb = b.String()
	return tomb[len(m.tombPrefix):], tomb
}

// base32Alphabet is RFC 4648's, which rand.Text writes.
const base32Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

// grantValue returns the value of a hold a release granted to the join
// nonce, as the release wrote it: "<nonce>.<n>" (see lua/handon.lua and
// lua/rw_wake.lua), and m's value suffix.
func (m *engine) grantValue(nonce, n string) string {
	return nonce + "." + n + m.valueSuffix
}

// tomb returns value's tombstone key, when it is not known from
// freshValue ("").
func (m *engine) tomb(value, tomb string) string {
	if tomb != "" {
		return tomb
	}
	return m.tombPrefix + value
}

// release runs the release script for value (whose tombstone key is tomb,
// "" to derive it) on the targeted nodes (all when targets is nil). Nodes
// that could not be asked get the release again later, from the reaper.
// held says whether value was held on some node: the release of an acquire
// that no node granted is not worth a warning when the reaper gives up.
func (m *engine) release(ctx context.Context, value, tomb string, targets []bool, held bool) []nodeReply {
	s, keys, args := m.kind.releaseCall(value, m.tomb(value, tomb))
	replies := m.fanout(ctx, s, keys, args, targets)
	m.reapLater(value, replies, targets, held)
	return replies
}

// acquireArg returns the acquire script's last argument (see
// lua/acquire.lua): the ballot proposal, the waiters' queue member q, and
// the holder.
func (m *engine) acquireArg(proposal string, q ask) string {
	return proposal + ":" + q.member + ":" + q.flags + ":" + m.queueMS + ":" + m.holder
}

// leave takes member off the waiters' queue of the targeted nodes (all when
// targets is nil), and passes our turn on where a release gave it to us
// already (see lua/leave.lua): a waiter that gives up must not be woken
// later in the place of one still waiting, nor keep a turn (or a lock
// granted to it) it will not take. It is sent under cleanupBound(ctx), as
// releaseBy's release: what is not answered by then, or what a node cannot
// take yet, the reaper sends again in the background.
func (m *engine) leave(ctx context.Context, member string, targets []bool) {
	cctx, cancel := cleanupBound(ctx)
	s, keys, args := m.kind.leaveCall(member)
	replies := m.fanout(cctx, s, keys, args, targets)
	cancel()
	var left []redelivery
	giveUp := m.clk.Now().Add(tombstoneExpiries * m.cfg.expiry)
	for i, r := range replies {
		if (targets == nil || targets[i]) && r.err != nil && !r.over() {
			left = append(left, &pendingLeave{node: i, member: member, giveUp: giveUp})
		}
	}
	if len(left) > 0 {
		m.reapNow(left...)
	}
}

// settle counts the replies of a release or extend: nil when a quorum did
// it, ErrLockLost when so many nodes no longer hold our value that a quorum
// never can, and a quorum error otherwise.
func (m *engine) settle(replies []nodeReply) error {
	ok, gone := 0, 0
	var errs []error
	for _, r := range replies {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.vals[0] == releaseDone:
			ok++
		default:
			gone++
		}
	}
	switch {
	case ok >= m.quorum:
		return nil
	case gone > len(m.nodes)-m.quorum:
		return ErrLockLost
	}
	return &quorumError{nodes: len(m.nodes), answered: ok + gone, need: m.quorum, errs: errs}
}
