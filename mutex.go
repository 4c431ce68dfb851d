package netlock

import (
	"context"
	"strconv"
)

// mutexKind is the kind of a NetMutex: one key, one owner (lua/acquire.lua,
// release.lua, extend.lua, leave.lua).
type mutexKind struct {
	m *engine
}

func (mutexKind) observed() Kind { return KindMutex }

func (k mutexKind) acquireCall(value, tomb, proposal string, q ask) (*Script, []string, []string) {
	m := k.m
	arg := m.freeArg // an uncontended attempt on one node
	if proposal != "0" || q != (ask{}) {
		arg = m.acquireArg(proposal, q)
	}
	keys, args := m.keys.lockCall(tomb, value, m.expiryMS, arg)
	return acquireScript, keys, args
}

func (mutexKind) acquireReply(vals []int64) acquireReply { return readAcquire(vals) }

func (k mutexKind) releaseCall(value, tomb string) (*Script, []string, []string) {
	m := k.m
	keys, args := m.keys.lockCall(tomb, value, m.tombMS, m.wakeTries)
	return releaseScript, keys, args
}

func (k mutexKind) extendCall(value string) (*Script, []string, []string) {
	m := k.m
	return extendScript, m.extendKeys, []string{value, m.expiryMS, m.queueMS}
}

func (mutexKind) extended(*hold, []nodeReply) {}

// keepCall returns the extend script, keys and arguments that set the key
// of value to expire in ms (WithMinHold: a hold released early keeps
// excluding until then).
func (k mutexKind) keepCall(value string, ms int64) (*Script, []string, []string) {
	m := k.m
	return extendScript, m.extendKeys, []string{value, strconv.FormatInt(ms, 10), m.queueMS}
}

func (k mutexKind) leaveCall(member string) (*Script, []string, []string) {
	m := k.m
	keys := []string{m.keys.waiters, m.keys.lock, m.keys.fence}
	if m.keys.fence == "" {
		keys = keys[:2]
	}
	return leaveScript, keys, []string{member, m.wakeTries}
}

// waitFlags: join the queue while listening (at its head if a turn was
// lost), leave it on success if we may be in it. A waiter that cannot
// listen polls without a place.
func (mutexKind) waitFlags(listening, turn, queued bool) string {
	switch {
	case listening && turn && queued:
		return "jtq"
	case listening && turn:
		return "jt"
	case listening && queued:
		return "jq"
	case listening:
		return "j"
	case queued:
		return "q"
	}
	return ""
}

func (mutexKind) ordered() bool { return false }

func (mutexKind) messageGrant(*grant) {}

func (mutexKind) rule() localRule { return exclusiveRule{} }

// exclusiveRule is the local admission rule of a lock with one owner (a
// NetMutex; an Election's and a MultiMutex's kinds): a hold given back goes
// to the first goroutine in line, within the hand-off budget.
type exclusiveRule struct{}

func (exclusiveRule) admitLocked(m *engine, h *hold, n int64) (rest int64, handed int) {
	if len(m.waiters) == 0 || !m.mayHandOffLocked(h) {
		return n, 0
	}
	m.handOffLocked(m.waiters[0], h)
	return n - 1, 1
}

// leftLocked: nothing is left to do; another goroutine's place is this
// process's only.
func (exclusiveRule) leftLocked(*engine, *localWaiter, int) func(context.Context) { return nil }

// unwanted unlocks the hold handed to w, which goes to the next in line or
// back to Redis.
func (exclusiveRule) unwanted(ctx context.Context, m *engine, w *localWaiter) {
	m.unlock(ctx, w.shared)
}
