package netlock

import (
	"context"
	"errors"
	"log/slog"
)

// A closable is a Backend whose client may be closed while its Hub's
// connection lives on, unknown to the Hub: a redigo pool's Close closes no
// connection dialed outside the pool, and rueidis's Close no dedicated
// connection in use. A release then still counts the closed client's
// waiter, and may grant it the lock by message. (go-redis closes its
// pub/sub connections with the client: the release that comes next counts
// nobody for its waiters and passes the turn on in its own script.) So a
// waiter granted the lock by message, or by an attempt that was on its way
// at Close, asks such a Backend whether its client is closed before it
// takes the grant; if it is, the waiter passes the grant on over a
// connection that outlived the client, closes the Hub, and fails (see
// keeps; leaveClosed, for a waiter whose attempt failed so).
//
// Why there: neither client says when it is closed, and neither can be
// asked but by a call. Asked at the grant, both answer without a round
// trip while they are open (rueidis always; redigo when the pool has an
// idle connection, as it has right after the waiter's own attempt), where
// confirming each grant by a call would cost a round trip per grant, and
// watching the client (a subscription on rueidis's pipelined connection,
// which its Close closes) would change the connection that every other
// call of the application uses, and which some servers (miniredis) then
// refuse scripts on.
type closable interface {
	// closed returns the client's error if it has been closed, nil if
	// not, bounded by ctx.
	closed(ctx context.Context) error
	// evalClosed runs s as Eval does, on a connection that outlives the
	// closed client: redigo dials one with the pool's Dial function;
	// rueidis uses the Hub's connection that listens on channel, whose
	// subscriptions it drops, and returns errNotListening if no such
	// connection listens on channel.
	evalClosed(ctx context.Context, channel string, s *Script, keys, args []string) ([]int64, error)
}

// keeps returns nil if m's client can keep g, the hold a waiter that
// waited was granted by message or took with an attempt. If the client
// was closed meanwhile (a redigo pool or a rueidis client lets a call in
// flight finish), it releases g over a connection that outlives the client
// (see closable), which passes the lock on to the next waiter, closes the
// Hub, and returns an error naming the node, which matches ErrQuorum: the
// waiter fails rather than hold a lock it could neither extend nor
// release. Over several nodes a closed client costs a vote, not the hold:
// not looked at. An acquire that did not wait is not looked at either: it
// is not worth a look at every uncontended acquire.
func (w *waiter) keeps(ctx context.Context, g grant) error {
	m := w.m
	if !w.queued || len(m.nodes) != 1 || m.hubs[0] == nil {
		return nil
	}
	c, ok := m.nodes[0].(closable)
	if !ok {
		return nil
	}
	bound, cancel := context.WithTimeout(detached(ctx), m.cfg.nodeTimeout)
	defer cancel()
	err := c.closed(bound)
	if err == nil {
		return nil
	}
	s, keys, args := w.a.passOnCall(g)
	if _, rerr := c.evalClosed(bound, m.waitChan, m.script(0, s), keys, args); rerr != nil {
		m.warnClosed(ctx, 0, rerr)
	}
	m.hubs[0].clientClosed()
	w.queued = false // left the queue when it was granted
	return &quorumError{nodes: 1, need: 1, errs: []error{nodeError(0, err)}}
}

// warnClosed logs that a waiter of the closed client of node i could not
// pass its turn on (err): a grant to it expires.
func (m *engine) warnClosed(ctx context.Context, i int, err error) {
	if l := m.log(ctx, slog.LevelWarn); l != nil {
		l.LogAttrs(ctx, slog.LevelWarn, "netlock: a waiter of a closed client could not pass its turn on; a grant to it expires", m.lockAttr(), slog.Int("node", i), errAttr(err))
	}
}

// leaveClosed looks for the nodes whose client has been closed (see
// closable). On each, it leaves the waiters' queue (lua/leave.lua), over a
// connection that outlives the client, passing on a grant a release made
// to the waiter meanwhile; and it closes the node's Hub, so that the
// releases to come count none of the client's waiters.
func (w *waiter) leaveClosed(ctx context.Context) {
	m := w.m
	for i, b := range m.nodes {
		c, ok := b.(closable)
		if !ok || m.hubs[i] == nil {
			continue
		}
		bound, cancel := context.WithTimeout(detached(ctx), m.cfg.nodeTimeout)
		if err := c.closed(bound); err != nil {
			if w.queued {
				s, keys, args := w.a.leaveCall(w.ask().member)
				// Not listening, the waiter is one a release skips.
				if _, lerr := c.evalClosed(bound, m.waitChan, m.script(i, s), keys, args); lerr != nil && !errors.Is(lerr, errNotListening) {
					m.warnClosed(ctx, i, lerr)
				}
			}
			m.hubs[i].clientClosed()
		}
		cancel()
	}
}
