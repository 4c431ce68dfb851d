package netlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Redis ACLs. A user whose ACL lets it run scripts on netlock's keys but
// not publish on its channels (Redis 7's default for a new user,
// acl-pubsub-default resetchannels) would have its waits and releases
// refused half-way: a script that writes and then publishes keeps its
// writes when the PUBLISH is refused. So the scripts ask before they write
// (lua/nopublish.lua), and a waiter, before it first listens on a
// Backend, and an Election, before it campaigns, ask whether the user may
// publish and subscribe on the lock's channels (lua/channels.lua): a user
// who may not gets an error naming the ACL rule to add, and nothing is
// done. docs/operating.md lists the ACL netlock needs.

// checkChannels asks the nodes of need (every node if need is nil) whether
// the user may publish and subscribe on m's channels, and returns the
// first refusal, named by its node: an error NOPERM that names the ACL rule
// to add. A node whose Hub (every Backend netlock provides has one) has
// answered yes for m's prefix is not asked again; without a Hub, a node is
// asked each time. Any other answer (a node that does not answer, a server
// that cannot tell) returns nil and is not kept: the call that follows
// reports it, and the node is asked again next time; but if ctx's
// deadline passed while nodes did not answer, it returns ctx's cause joined
// with their errors (matching ErrQuorum).
func (m *engine) checkChannels(ctx context.Context, need []bool) error {
	targets := make([]bool, len(m.nodes))
	any := false
	for i, h := range m.hubs {
		if need != nil && !need[i] {
			continue
		}
		if h != nil {
			if _, ok := h.channels.Load(m.cfg.prefix); ok {
				continue
			}
		}
		targets[i], any = true, true
	}
	if !any {
		return nil
	}
	replies := m.fanout(ctx, channelsScript, []string{m.waitChan}, nil, targets)
	var errs []error
	for i, r := range replies {
		switch {
		case !targets[i]:
		case r.err == nil:
			if h := m.hubs[i]; h != nil {
				h.channels.Store(m.cfg.prefix, struct{}{})
			}
		case aclRefusal(r.err):
			// An answer that retrying cannot change: as the acquire's,
			// it matches ErrQuorum.
			return &quorumError{nodes: len(m.nodes), need: m.quorum, errs: []error{r.err}}
		case !errors.Is(r.err, context.Canceled):
			// A call the caller's cancellation cut short says nothing of
			// Redis (see lostRound).
			errs = append(errs, r.err)
		}
	}
	if cause := ctxEnded(ctx); cause != nil && len(errs) > 0 {
		// ctx ended while nodes did not answer: Redis could not be asked
		// (not a lock held by another, which nobody asked about).
		return unreachable(cause, &quorumError{nodes: len(m.nodes), answered: len(m.nodes) - len(errs), need: m.quorum, errs: errs})
	}
	return nil
}

// aclRefusal reports whether err is Redis's refusal of a command or a
// channel to the connection's user, or a netlock script's (NOPERM).
func aclRefusal(err error) bool {
	return err != nil && strings.Contains(err.Error(), "NOPERM")
}

// subscribeRefused returns the error for a SUBSCRIBE of channel that the
// server refused with err, an ACL refusal: in the words of the scripts'
// (lua/channels.lua), naming the rule to add.
func subscribeRefused(channel string, err error) error {
	prefix, _, _ := strings.Cut(channel, "{")
	return fmt.Errorf("NOPERM netlock: this user may not subscribe on %s: add the channel rule &%s* (ACL SETUSER <user> &%s*): %w", channel, prefix, prefix, err)
}
