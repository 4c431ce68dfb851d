package netlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
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

// nodeReply is one node's answer to one script call.
type nodeReply struct {
	vals []int64
	err  error
	// permanent: err is an answer that retrying cannot change (see
	// permanentErr).
	permanent bool
	// unsent: the call was never sent (no slot of the node's limiter came
	// free in time), so it cannot have changed anything on the node.
	unsent bool
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

// fanout runs s on the nodes selected by targets (all when targets is nil),
// in parallel, each call as call runs it, and returns one reply per node.
// The calls that find a slot of their node's limiter free at once are
// bounded by one node timeout (they start together). It joins every
// per-node goroutine before returning, so no call outlives it; the last
// call runs on the calling goroutine, and a single call (a plain lock) runs
// there without a goroutine at all. Over redigo Backends the calls are
// sent from the calling goroutine too, and their replies read in turn (see
// fanoutPipelined).
func (m *engine) fanout(ctx context.Context, s *Script, keys, args []string, targets []bool) []nodeReply {
	sent, cancel := m.bound(ctx)
	defer unbound(sent, cancel)
	replies := make([]nodeReply, len(m.nodes))
	last, n := -1, 0
	for i := range m.nodes {
		if targets == nil || targets[i] {
			last = i
			n++
		}
	}
	switch {
	case n <= 1:
		// One call (a plain lock): no goroutine, nor a WaitGroup to make.
		if last >= 0 {
			replies[last] = m.call(ctx, sent, last, s, keys, args)
		}
		return replies
	case m.pipelined:
		m.fanoutPipelined(ctx, sent, s, keys, args, targets, replies)
		return replies
	}
	var wg sync.WaitGroup
	for i := range m.nodes {
		if i != last && (targets == nil || targets[i]) {
			wg.Go(func() { replies[i] = m.call(ctx, sent, i, s, keys, args) })
		}
	}
	replies[last] = m.call(ctx, sent, last, s, keys, args)
	wg.Wait()
	return replies
}

// call runs s on node i and checks the shape of the reply: want integers.
// It takes a slot of the node's limiter. If one is free, the call is bounded
// by sent, a node timeout begun as the caller began its calls. Otherwise it
// waits for a slot within ctx (within the expiry if ctx has no deadline),
// and the call is bounded by a node timeout of its own from then.
//
// The node timeout is how long a node may take to answer; the wait for a
// slot is this process's own crowd (ten thousand unlocks at once), which
// the node has no part in: counted against the node timeout, it would turn
// a crowd of acquires into failed rounds that retry at the back of the
// queue, and a crowd of unlocks into releases handed to the reaper. A slot
// comes free within a node timeout of each call ahead, so the wait ends.
//
// With WithSyncReplicas, an acquire or extend also waits for the node's
// replicas (see ReplicaWaiter), and one that wrote a hold that
// too few of them acknowledged is an error: ErrNotReplicated. For an
// acquire it is permanent, so that the waiter reports it at once instead of
// riding out what is most likely a replica down (the caller's cleanup
// releases the key); for an extend it is not: the extend does not count,
// the local deadline stays, and the watchdog tries again. A busy acquire
// writes no hold (joining the queue does not need the replicas), and its
// count is not looked at.
func (m *engine) call(ctx, sent context.Context, i int, s *Script, keys, args []string) nodeReply {
	slots, waited, err := m.limiters[i].enter(ctx, s, m.cfg.expiry)
	if err != nil {
		return nodeReply{err: nodeError(i, err), unsent: true}
	}
	defer exit(slots)
	if waited {
		var cancel context.CancelFunc
		sent, cancel = m.bound(ctx)
		defer unbound(sent, cancel)
	}
	s = m.script(i, s)
	if !(m.cfg.replicas > 0 && (s.op == opAcquire || s.op == opExtend)) {
		vals, err := m.nodes[i].Eval(sent, s, keys, args)
		return m.reply(i, s, vals, err)
	}
	start := time.Now()
	vals, acked, err := m.nodes[i].(ReplicaWaiter).EvalWait(sent, s, keys, args, m.cfg.replicas)
	r := m.reply(i, s, vals, err)
	// An acquire's acquireHeld and an extend's releaseDone are both 1: the
	// hold was written.
	if r.err == nil && vals[0] == acquireHeld && acked < m.cfg.replicas {
		err := &replicaError{acked: acked, want: m.cfg.replicas, took: time.Since(start).Round(time.Millisecond)}
		return nodeReply{err: nodeError(i, err), permanent: s.op == opAcquire}
	}
	return r
}

// script returns the variant of s to run on node i.
func (m *engine) script(i int, s *Script) *Script {
	if s.sharded != nil && m.hubs[i] != nil && m.hubs[i].sharded() {
		return s.sharded // its waiters listen with SSUBSCRIBE
	}
	return s
}

// reply checks node i's answer to s: an error, or integers of the shape s
// returns.
func (m *engine) reply(i int, s *Script, vals []int64, err error) nodeReply {
	if err == nil && (len(vals) == 0 || (s.op == opAcquire && len(vals) != 3 && len(vals) != 4)) {
		return nodeReply{err: nodeError(i, fmt.Errorf("%s script: unexpected reply %v", s.Name(), vals)), permanent: true}
	}
	if err != nil {
		return nodeReply{err: nodeError(i, err), permanent: permanentErr(m.nodes[i], s.op, err)}
	}
	return nodeReply{vals: vals}
}

// A pipeliner is a Backend that sends a call and reads its reply later, on
// the calling goroutine (see fanoutPipelined): redigo's.
type pipeliner interface {
	// ready reports whether a call sent now most likely takes no round
	// trip before it is sent.
	ready() bool
	// send sends s, bounded by ctx, and returns the call, whose receive
	// reads its reply.
	send(ctx context.Context, s *Script, keys, args []string) sentCall
}

// A sentCall is a call a pipeliner sent, whose reply is still to read.
type sentCall interface {
	receive() ([]int64, error)
}

// fanoutPipelined is fanout over nodes that are all pipeliners (see
// engine.pipelined), with the replies in replies. redigo runs a call on
// the calling goroutine, one at a time; a goroutine per node would cost a
// goroutine and its wake-up per node and call. Instead, on each node whose
// limiter has a slot free and whose pool is ready (an idle connection, no
// TestOnBorrow), it sends the call, all before reading any reply, then
// reads the replies one after the other: the calls overlap on the nodes
// just as they do from goroutines of their own, each bounded by sent. A
// node that could keep the calling goroutine waiting before its call is
// sent (for a slot of its limiter, a dial, a PING) gets a goroutine, as in
// fanout, so that the others' calls are not held up.
func (m *engine) fanoutPipelined(ctx, sent context.Context, s *Script, keys, args []string, targets []bool, replies []nodeReply) {
	var wg sync.WaitGroup
	calls := make([]sentCall, len(m.nodes))
	sentScripts := make([]*Script, len(m.nodes))
	slots := make([]chan struct{}, len(m.nodes))
	for i := range m.nodes {
		if targets != nil && !targets[i] {
			continue
		}
		b := m.nodes[i].(pipeliner)
		var ok bool
		if slots[i], ok = m.limiters[i].tryEnter(s); ok && !b.ready() {
			exit(slots[i])
			ok = false
		}
		if !ok {
			wg.Go(func() { replies[i] = m.call(ctx, sent, i, s, keys, args) })
			continue
		}
		sentScripts[i] = m.script(i, s)
		calls[i] = b.send(sent, sentScripts[i], keys, args)
	}
	for i, c := range calls {
		if c != nil {
			vals, err := c.receive()
			exit(slots[i])
			replies[i] = m.reply(i, sentScripts[i], vals, err)
		}
	}
	wg.Wait()
}

// bound returns the context that bounds calls to the nodes that begin now:
// ctx, with a deadline a node timeout from now; and the function that
// releases it, nil for a callBound (see unbound). The Backends netlock
// provides get a callBound, which costs a timer only if asked for Done.
func (m *engine) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if !m.lazyBounds {
		return context.WithTimeout(ctx, m.cfg.nodeTimeout)
	}
	by := time.Now().Add(m.cfg.nodeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(by) {
		by = dl
	}
	return newCallBound(ctx, by), nil
}

// unbound releases what bound returned, once the calls it bounds have
// returned.
func unbound(sent context.Context, cancel context.CancelFunc) {
	if cancel != nil {
		cancel()
	} else if b, ok := sent.(*callBound); ok {
		b.release()
	}
}

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

func (a quorumAcquirer) ordered() bool { return a.m.kind.ordered() }

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
	m.kind.messageGrant(&g)
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
		a := m.kind.acquireReply(r.vals)
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

// cleanupGrace is how long past the caller's deadline the cleanup of a
// call that failed (a release of what an acquire round may have taken, a
// leave of the waiters' queue) may keep the caller: time for one round trip
// to a server that answers, so that the cleanup is done when the call
// returns, and no more, so that a server that does not answer keeps the
// caller no longer than that past its deadline. What is not answered by
// then, the reaper sends again.
const cleanupGrace = 5 * time.Millisecond

// cleanupBound returns the context of a cleanup made by a call whose
// context is ctx: ctx's values, not its cancellation. A ctx whose deadline
// ended it, or will, bounds the cleanup to cleanupGrace past that deadline
// (past now, if it has passed): a deadline is the time the caller gave the
// call. A ctx cancelled before its deadline, or without one, leaves the
// cleanup bounded by the node timeout alone: a cancellation is the
// caller's own act, and the cleanup it waits for leaves nothing behind
// when the call returns.
func cleanupBound(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok || errors.Is(ctx.Err(), context.Canceled) {
		return detached(ctx), func() {}
	}
	if now := time.Now(); dl.Before(now) {
		dl = now
	}
	return context.WithDeadline(context.WithoutCancel(ctx), dl.Add(cleanupGrace))
}

// detached returns ctx without its cancellation (context.WithoutCancel),
// or ctx itself if it has neither cancellation nor deadline: the contexts
// of Lock and Unlock, which need no wrapping.
func detached(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		if _, ok := ctx.Deadline(); !ok {
			return ctx
		}
	}
	return context.WithoutCancel(ctx)
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

// lockCall returns the keys of an acquire or release script (lock,
// tombstone, waiters' queue, and the fence counter with fencing on) and its
// three arguments, in one allocation.
func (k *keys) lockCall(tomb, arg1, arg2, arg3 string) (keys, args []string) {
	all := []string{k.lock, tomb, k.waiters, k.fence, arg1, arg2, arg3}
	keys = all[:4:4]
	if k.fence == "" {
		keys = all[:3:3]
	}
	return keys, all[4:]
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

// ctxEnded returns ctx's cause if ctx is done or its deadline has passed. A
// client library that turns the deadline into a socket deadline (redigo does)
// reports an i/o timeout a moment before ctx.Err is set; that is still the
// caller's deadline, not a node failure.
func ctxEnded(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}
