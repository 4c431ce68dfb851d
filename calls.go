package netlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

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

// A pipelinedCall is a call fanoutPipelined sent to a node, and the script
// it runs.
type pipelinedCall struct {
	sentCall
	s *Script
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
	// Per node, the call sent and the script it runs (m.script's: what
	// the reply is read for), on the stack for a quorum of up to five.
	var buf [5]pipelinedCall
	calls := buf[:min(len(m.nodes), len(buf))]
	if len(m.nodes) > len(buf) {
		calls = make([]pipelinedCall, len(m.nodes))
	}
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
		calls[i].s = m.script(i, s)
		calls[i].sentCall = b.send(sent, calls[i].s, keys, args)
	}
	for i, c := range calls {
		if c.sentCall != nil {
			vals, err := c.receive()
			exit(slots[i])
			replies[i] = m.reply(i, c.s, vals, err)
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
