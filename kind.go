package netlock

import (
	"context"
	"time"
)

// The engine (engine.go: the holds and their watchdog, the waiting calls,
// the quorum fan-out, the reaper, the in-process queue) runs a kind of
// lock; a kind says what differs between kinds: its keys and scripts, how a
// reply becomes an outcome, and what its waiters ask for. Each kind builds
// its engine from a spec (see newEngine), and its code is in files of its
// own: mutexKind in netmutex.go, rwSide (a NetRWMutex's read lease or write
// lock) in rwside.go, semLease (a Semaphore's lease) and semAcquirer (how
// its waiter takes it) in semlease.go, electionKind in election.go,
// multiKind in multi.go, onceKind in once.go.

// A leaseKind is what a hold needs of its kind: how to extend it, and how
// observers and logs name it.
type leaseKind interface {
	// observed is the Kind an Observer's events carry.
	observed() Kind
	// extendCall returns the extend script, its keys and arguments, for
	// the hold of value.
	extendCall(value string) (*Script, []string, []string)
}

// A kind is a kind of lock a waiter acquires: a leaseKind with the scripts
// that take, give back and queue for the hold. What only some kinds do is
// an optional interface (replyReader, extendReader, grantReader, ordered,
// ruled), found once by newEngine (see kindOptions).
type kind interface {
	leaseKind
	// acquireCall returns the acquire script, keys and arguments for an
	// acquire of value (whose tombstone key is tomb) proposing the fencing
	// token proposal, as the waiters' queue member q.
	acquireCall(value, tomb, proposal string, q ask) (*Script, []string, []string)
	// releaseCall returns the release script, keys and arguments for value
	// (whose tombstone key is tomb).
	releaseCall(value, tomb string) (*Script, []string, []string)
	// keepCall returns the extend script, keys and arguments that set the
	// hold of value to expire in ms (WithMinHold: a hold released early
	// keeps excluding until then).
	keepCall(value string, ms int64) (*Script, []string, []string)
	// leaveCall returns the script, keys and arguments that take member off
	// the waiters' queue and pass on a turn given to it.
	leaveCall(member string) (*Script, []string, []string)
	// waitFlags returns the acquire script's flags for a waiting call that
	// is listening or not, whose turn came (a release named it), and that
	// may be queued already.
	waitFlags(listening, turn, queued bool) string
}

// A replyReader is a kind whose acquire script's reply says more than
// lua/acquire.lua's (see readAcquire, the others' reader).
type replyReader interface {
	// acquireReply reads one node's reply to the acquire script.
	acquireReply(vals []int64) acquireReply
}

// An extendReader is a leaseKind whose extend script's replies say more
// than whether the extend succeeded.
type extendReader interface {
	// extended takes in what a quorum's replies to an extend of h say
	// besides its success.
	extended(h *hold, replies []nodeReply)
}

// A grantReader is a kind whose release's message granting a waiter the
// hold says more than a NetMutex's (see lua/handon.lua).
type grantReader interface {
	// messageGrant completes a grant told by a release's message, whose
	// last number is in g.token.
	messageGrant(g *grant)
}

// An ordered kind is one whose waiter's place is its arrival time, the
// same on every node (see ask.arrival); the others' is the order they
// joined each node's queue in.
type ordered interface {
	orderedByArrival()
}

// A ruled kind has a local admission rule of its own (see localRule); the
// others' is exclusiveRule, one goroutine at a time.
type ruled interface {
	rule() localRule
}

// kindOptions are what a kind does of the optional interfaces above, found
// once by newEngine.
type kindOptions struct {
	reply    func(vals []int64) acquireReply // readAcquire, or a replyReader's
	extended func(h *hold, replies []nodeReply)
	granted  func(g *grant)
	ordered  bool
	rule     localRule
}

// optionsOf returns k's kindOptions; rule is the local rule of a kind that
// acquires by calls of its own (k is a leaseKind only: a Semaphore's).
func optionsOf(k leaseKind, rule localRule) kindOptions {
	o := kindOptions{reply: readAcquire, rule: rule}
	if r, ok := k.(replyReader); ok {
		o.reply = r.acquireReply
	}
	if r, ok := k.(extendReader); ok {
		o.extended = r.extended
	}
	if r, ok := k.(grantReader); ok {
		o.granted = r.messageGrant
	}
	_, o.ordered = k.(ordered)
	if r, ok := k.(ruled); ok {
		o.rule = r.rule()
	}
	if o.rule == nil {
		o.rule = exclusiveRule{}
	}
	return o
}

// Reply statuses of the acquire scripts (lua/acquire.lua,
// lua/rw_acquire.lua), read by acquireReply.
const (
	acquireHeld   = 1  // acquired, or our own hold confirmed (a retry)
	acquireBusy   = -1 // held by another value
	acquireFenced = -2 // free, but the proposed token is not above the counter
	acquireLate   = -3 // our value was already released: a late request
)

// Reply statuses of the release and extend scripts (lua/release.lua,
// lua/extend.lua, lua/rw_release.lua, lua/rw_extend.lua), read by settle.
const (
	releaseDone   = 1  // released, or extended
	releaseAbsent = 0  // the key does not exist (expired or deleted)
	releaseOther  = -1 // the key holds another value: left untouched
)

// An acquireReply is one node's reply to an acquire script.
type acquireReply struct {
	status  int64
	counter int64 // held: the token; otherwise the fence counter (a ballot's)
	// granted, held: n > 0 when a release granted us the hold under the
	// value "<nonce>.<n>" (see lua/handon.lua).
	granted int64
	pttl    time.Duration // busy: the holder's remaining TTL, -1 if none
	// rejoin, busy: our member is no longer queued; join again under a
	// fresh nonce.
	rejoin bool
	// writerWaits, a read lease held: a writer waits (see lua/rw_acquire.lua).
	writerWaits bool
}

// readAcquire reads the reply of acquire.lua (and, as far as they agree,
// rw_acquire.lua's): {status, counter, n or pttl[, rejoin]}.
func readAcquire(vals []int64) acquireReply {
	r := acquireReply{status: vals[0], counter: vals[1]}
	switch r.status {
	case acquireHeld:
		r.granted = vals[2]
	case acquireBusy:
		r.pttl = time.Duration(vals[2]) * time.Millisecond
		r.rejoin = len(vals) > 3 && vals[3] == 1
	}
	return r
}

// An acquirer is how one waiting call (see waiter) takes a lock of its
// kind: the rounds it makes, the grants a release's message makes it, and
// how it leaves the waiters' queue. The waiter runs it the same for every
// kind: quorumAcquirer for the kinds a quorum round takes (mutexKind,
// rwSide, multiKind, electionKind), semAcquirer for a Semaphore's lease.
type acquirer interface {
	// flags returns the acquire script's flags for a waiting call that is
	// listening or not, whose turn came, and that may be queued already
	// ("" for a call that neither joins nor may be queued).
	flags(listening, turn, queued bool) string
	// ordered reports whether a waiter's place is its arrival time (see
	// ask.arrival).
	ordered() bool
	// round makes one attempt as the waiters' queue member q.
	round(ctx context.Context, q ask) outcome
	// messageGrant reads a release's message on our channel: the grant it
	// makes us, if any (start set), for take.
	messageGrant(ctx context.Context, w *waiter, payload string) (grant, bool)
	// take makes g, acquired by a round or granted by message, the
	// caller's, if the caller's client can keep it (see waiter.keeps).
	// Nodes that did not grant (unqueue) may keep w in their waiters'
	// queues. It reports false, with a nil error, when a grant by message
	// is not taken after all: the next round finds it.
	take(ctx context.Context, w *waiter, g grant, unqueue []bool) (bool, error)
	// leave takes member off the waiters' queues (on the nodes targets
	// selects; all when nil) after a wait that failed, and reports whether
	// the caller holds after all: a hold handed to it meanwhile by a
	// goroutine of its process.
	leave(ctx context.Context, member string, targets []bool) (held bool)
	// leaveCall returns the script, keys and arguments of leave, to run
	// over a connection that outlives a closed client (see closable).
	leaveCall(member string) (*Script, []string, []string)
	// passOnCall returns the script, keys and arguments that give back g,
	// a grant a closed client cannot keep, to the next waiter.
	passOnCall(g grant) (*Script, []string, []string)
}
