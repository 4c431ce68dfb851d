package netlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/netlock-go/netlock/internal/clock"
	"github.com/netlock-go/netlock/internal/keyspace"
)

// A NetMutex is a mutual exclusion lock shared across processes and machines
// through Redis. Its Lock and Unlock methods make it a drop-in sync.Locker;
// the ctx methods (LockCtx, TryLockCtx, UnlockCtx, ExtendCtx) return errors
// instead of panicking and honour deadlines and cancellation.
//
// A NetMutex is safe for concurrent use by many goroutines, like sync.Mutex:
// goroutines of one process that share a NetMutex exclude each other locally,
// in order of arrival, and only one of them at a time talks to Redis to
// acquire. Unlock may be called from a goroutine other than the one that
// locked.
//
// After a failed acquire or an Unlock that could not reach every node, a
// NetMutex keeps one goroutine that delivers the release to those nodes when
// they answer again. It ends when all have answered, when their clients are
// closed, or after ten expiries.
//
// While goroutines of this process wait on a NetMutex, Unlock passes the
// hold straight to the first of them, without a round trip to Redis, a
// bounded number of times in a row (WithLocalHandoffs).
//
// A NetMutex must be created with New or Client.Mutex and must not be copied
// after first use.
type NetMutex struct {
	name       string
	cfg        config
	nodes      []Backend
	quorum     int
	keys       keys
	extendKeys []string // lock, waiters' queue
	expiryMS   string   // cfg.expiry in ms, as the scripts take it
	tombMS     string   // TTL of a tombstone: tombstoneExpiries
	queueMS    string   // TTL of the waiters' queue: queueExpiries
	// holder is WithHolderInfo's identity as the scripts write it with a
	// hold (escaped: keyspace.HolderEncode).
	holder string
	// valueSuffix ends every value of m's holds: "" where the holder is
	// written beside the value (a lock key's "<value>:<token>:<holder>"),
	// "+<holder>" where the value is all there is (a NetRWMutex's read
	// lease, a member of a sorted set; keyspace.LeaseSuffix).
	valueSuffix string
	driftTerm   time.Duration

	hubs []*Hub // per node: its Backend's pub/sub hub, nil if it has none
	// limiters: per node, its Backend's bound on calls in flight (its
	// Hub's), nil if it has no Hub.
	limiters []*limiter
	// waiterID names m in the waiters' queues while it waits. One id per
	// NetMutex is enough: only the goroutine that owns m waits in Redis.
	waiterID string
	waitChan string // its own release channel, p{name}:released:<waiterID>
	// alsoChans, for a MultiMutex's engine: the release channels of its
	// other names, which its waiter watches too; nil otherwise.
	alsoChans []string
	// wakeTries is how many queued waiters a release tries in a row,
	// skipping those nobody listens for (releaseWakeTries); 1 where a
	// node's hub cannot tell (PUBLISH does not count them: a Redis Cluster
	// without sharded pub/sub), as a string for the scripts.
	wakeTries string
	// grants: a release may grant a waiter of m the lock in its own script
	// (one node, whose hub lets PUBLISH or SPUBLISH count the listeners,
	// and no WithSyncReplicas; see lua/handon.lua), sparing it the acquire
	// round trip.
	grants bool
	epoch  time.Time
	// clk is the time of m's holds and waits: the real clock, or the one
	// package netlocktest attached to a Backend (see internal/clock).
	clk clock.Clock
	// tombPrefix is the tombstone keys' common part: a value's tombstone
	// key is tombPrefix+value (see freshValue).
	tombPrefix string
	// freeArg is the acquire script's last argument for an uncontended
	// attempt on one node: ":<holder>", all it needs (see lua/acquire.lua).
	freeArg string
	// lazyBounds: every node is a Backend of netlock's own, whose calls
	// are bounded by a callBound (see NetMutex.bound).
	lazyBounds bool
	// pipelined: the nodes, more than one, are all redigo Backends, and
	// no call waits for replicas: a fanout sends its calls before it reads
	// their replies, on the calling goroutine (see fanoutPipelined).
	pipelined bool

	// kind is the kind of lock m acquires: a NetMutex's, a NetRWMutex's
	// read lease or write lock; nil for a Semaphore's engine, which
	// acquires by its own calls. leaseKind is its holds' kind: kind, or a
	// Semaphore's lease.
	kind      kind
	leaseKind leaseKind
	// rule is the kind's local admission rule: whom of the local line a
	// hold of the process serves (see localRule).
	rule localRule

	mu sync.Mutex
	// The local queue. A goroutine owns m in this process from the moment
	// it finds m not owned, or is handed m from the queue, until UnlockCtx
	// (or its failed acquire) hands m to the next local waiter or leaves it
	// not owned. Only the owner talks to Redis to acquire.
	owned   bool
	waiters []*localWaiter // FIFO
	// first is the owner's waiter when it came to own m from the line
	// (queueLocked, passOwnershipLocked); nil when the owner has none (own,
	// tryOwn) or was handed a hold (handOffLocked). A Semaphore's first
	// waiter owns m this way: it talks to Redis for the process's waiters,
	// and a release may hand it permits (see semLease.admitLocked).
	first    *localWaiter
	hold     *hold     // set by a successful acquire or a hand-off, cleared by UnlockCtx
	since    time.Time // when the holding goroutine's LockCtx or TryLockCtx returned
	handoffs int       // hand-offs in a row of the current hold
	// shared counts the goroutines that own m together, when its owner is
	// shared (see localWaiter); 0 when the owner is one goroutine or m is
	// not owned.
	shared int
	// drained, while a goroutine waits in enterShared, is closed when no
	// goroutine holds or waits for m shared any more (see drainedLocked).
	drained chan struct{}
	// gaveUp holds the nonces of m's last waiters that gave up, whose
	// grants nobody takes up (see orphan); gaveUpNext is where the next
	// goes.
	gaveUp     [4]string
	gaveUpNext int

	// seen is the highest fence counter learned from any node: the next
	// quorum ballot proposes seen+1.
	seen atomic.Uint64

	// yieldUntil, in nanoseconds since epoch, is set when an Unlock's
	// release reached other clients waiting on the release channel: an
	// acquire of this NetMutex that starts before then lets them try first.
	yieldUntil atomic.Int64

	// rtt is the round trip of m's releases, in ns, as noteRTT keeps it (0
	// until one is measured): what a call to Redis costs, at the least
	// (see NetRWMutex.sharesWrite).
	rtt atomic.Int64

	reaper reaper // releases still to deliver

	// The watchdog timer of m's holds (see arm). Lock order: a hold's mu
	// before dogMu.
	dogMu sync.Mutex
	dog   *time.Timer // nil until m's first hold
	dogAt time.Time   // when dog fires; zero when it is not set
	// watched are the holds dog ticks: armed and not released. Mostly one;
	// two while a Semaphore's or a NetRWMutex's new lease begins as the
	// last one ends, whose tick may arm the old one after the new.
	watched []*hold

	checked atomic.Bool // checkServers has run
}

var _ sync.Locker = (*NetMutex)(nil)

// New returns a NetMutex for the lock called name on backends: one backend is
// a plain lock; several independent deployments make a quorum lock, held
// when a majority (len(backends)/2+1) of them grant it with the same fencing
// token. It validates name, backends and options and returns an error naming
// what is wrong; it does not contact Redis.
//
// For a quorum the backends must be independent deployments (not replicas of
// one another, not the same server twice), and their fence counters must
// survive restarts (appendonly yes, appendfsync always), or a node that lost
// them must be re-seeded before it rejoins.
//
// Every NetMutex with the same name, prefix and backends, in any process,
// excludes every other.
func New(name string, backends []Backend, opts ...Option) (*NetMutex, error) {
	if err := checkNew(name, backends); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	clk := clock.Of(backends)
	m := &NetMutex{
		name:      name,
		cfg:       cfg,
		nodes:     append([]Backend(nil), backends...),
		quorum:    len(backends)/2 + 1,
		keys:      newKeys(cfg.prefix, name, cfg.fencing),
		expiryMS:  strconv.FormatInt(cfg.expiry.Milliseconds(), 10),
		tombMS:    strconv.FormatInt(tombstoneExpiries*cfg.expiry.Milliseconds(), 10),
		queueMS:   strconv.FormatInt(queueExpiries*cfg.expiry.Milliseconds(), 10),
		holder:    keyspace.HolderEncode(cfg.holderInfo),
		driftTerm: cfg.driftTerm(),
		hubs:      make([]*Hub, len(backends)),
		limiters:  make([]*limiter, len(backends)),
		waiterID:  rand.Text(),
		epoch:     clk.Now(),
		clk:       clk,
	}
	m.setKind(mutexKind{m})
	m.extendKeys = []string{m.keys.lock, m.keys.waiters}
	m.tombPrefix = m.keys.tomb("")
	m.freeArg = ":" + m.holder
	m.waitChan = m.keys.channel + ":" + m.waiterID
	if err := m.useHubs(); err != nil {
		return nil, err
	}
	m.lazyBounds = !slices.ContainsFunc(m.nodes, func(b Backend) bool { return !lazyBound(b) })
	m.pipelined = len(m.nodes) > 1 && cfg.replicas == 0 && !slices.ContainsFunc(m.nodes, func(b Backend) bool {
		_, ok := b.(*redigoBackend)
		return !ok
	})
	// With WithSyncReplicas, a waiter acquires for itself: a grant made by
	// the releaser's script would be a hold no replica was asked to
	// acknowledge.
	m.grants = len(backends) == 1 && m.hubs[0] != nil && m.hubs[0].counted && cfg.replicas == 0
	return m, nil
}

// checkNew checks New's name and backends, and returns what is wrong.
func checkNew(name string, backends []Backend) error {
	if err := checkName(name); err != nil {
		return err
	}
	if len(backends) == 0 {
		return errors.New("netlock: no backends")
	}
	for i, b := range backends {
		if b == nil {
			return fmt.Errorf("netlock: backend %d is nil", i)
		}
		if !reflect.TypeOf(b).Comparable() {
			continue
		}
		for j := range i {
			if reflect.TypeOf(backends[j]).Comparable() && backends[j] == b {
				// Two votes from one deployment would make the quorum a lie.
				return fmt.Errorf("netlock: backends %d and %d are the same", j, i)
			}
		}
	}
	return nil
}

// checkName checks a lock name, and returns what is wrong.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("netlock: empty lock name")
	case name[0] == '}':
		// The lock key p{}...} would have an empty hash tag, so its release
		// channel could fall in another cluster slot.
		return fmt.Errorf("netlock: lock name %q starts with '}'", name)
	}
	return nil
}

// useHubs takes each node's pub/sub hub and limiter, where its Backend has
// one (Subscriber), and sets how many waiters a release tries; it checks
// that the Backends can wait for replicas if asked to.
func (m *NetMutex) useHubs() error {
	tries := releaseWakeTries
	for i, b := range m.nodes {
		if _, ok := b.(ReplicaWaiter); !ok && m.cfg.replicas > 0 {
			return fmt.Errorf("netlock: WithSyncReplicas(%d): backend %d (%T) cannot wait for replicas: it does not implement netlock.ReplicaWaiter", m.cfg.replicas, i, b)
		}
		if s, ok := b.(Subscriber); ok {
			if h := s.Hub(); h != nil {
				if err := h.usable(); err != nil {
					return fmt.Errorf("netlock: backend %d: %w", i, err)
				}
				m.hubs[i], m.limiters[i] = h, h.calls
			}
		}
		if h := m.hubs[i]; h != nil && !h.counted {
			tries = 1
		}
	}
	m.wakeTries = strconv.Itoa(tries)
	return nil
}

// setKind makes k the kind of lock m acquires and holds.
func (m *NetMutex) setKind(k kind) {
	m.kind, m.leaseKind, m.rule = k, k, k.rule()
}

// Name returns the lock's name, as given to New.
func (m *NetMutex) Name() string {
	if m == nil {
		return ""
	}
	return m.name
}

// Lock locks m, blocking until the lock is acquired, however long that takes.
// It panics with the error if acquiring fails for any other reason than
// contention: Redis unreachable, a quorum not answering, a key of the wrong
// type. Use LockCtx to bound the wait and get the error instead.
func (m *NetMutex) Lock() {
	if err := m.LockCtx(context.Background()); err != nil {
		panic(err)
	}
}

// TryLock tries to lock m once, without waiting, and reports whether it
// succeeded, like sync.Mutex.TryLock. It returns false if another goroutine
// of this process holds m or another client holds the lock. It panics with
// the error if Redis could not be asked.
func (m *NetMutex) TryLock() bool {
	ok, err := m.TryLockCtx(context.Background())
	if err != nil {
		panic(err)
	}
	return ok
}

// Unlock unlocks m. Like sync.Mutex.Unlock, it panics only on misuse: if m
// is not locked (a panic whose value matches ErrNotHeld), or was not made by
// New or Client.Mutex. Whatever Redis does, it returns, with m unlocked in
// this process: a hold that had been lost is logged at Warn (and Lost was
// closed when it was found lost); a release that could not reach every node
// is logged at Warn and delivered in the background when the nodes answer.
// Use UnlockCtx to get these as errors.
func (m *NetMutex) Unlock() {
	err := m.UnlockCtx(context.Background())
	switch {
	case errors.Is(err, ErrNotHeld):
		panic(errUnlockUnlocked)
	case errors.Is(err, errZero):
		panic(err)
	}
}

// Token returns the fencing token of the current hold: a number that strictly
// increases with every acquisition of this lock name, across all clients.
// Pass it to the resource the lock protects, which must reject a write whose
// token is below the highest it has seen. It returns 0 when m is not locked
// or fencing is off. After the hold is lost, it returns the lost hold's token
// until Unlock.
func (m *NetMutex) Token() uint64 {
	if h := m.current(); h != nil {
		return h.token
	}
	return 0
}

// Lost returns a channel that is closed when the current hold ends without
// this client's say: its local deadline passed without a successful extend,
// or an extend found the key gone or taken. The channel is also closed when
// the hold is released by Unlock, so a goroutine watching it never outlives
// the hold. When m is not locked, Lost returns a closed channel.
func (m *NetMutex) Lost() <-chan struct{} {
	if h := m.current(); h != nil {
		return h.lostChan()
	}
	return closedChan
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (m *NetMutex) current() *hold {
	if m == nil {
		return nil // a nil *NetMutex holds nothing, like the zero value
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hold
}

// errZero is returned by a NetMutex that was not made by New or Client.Mutex.
var errZero = errors.New("netlock: NetMutex not created by New or Client.Mutex (the zero value is not usable)")

func (m *NetMutex) check() error {
	if m == nil || m.nodes == nil {
		return errZero
	}
	return nil
}
