package netlock

import (
	"cmp"
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

// An engine runs one lock of a kind (see kind): its holds and their
// watchdog, the in-process queue, the waiting calls, the quorum fan-out and
// the reaper. NetMutex, NetRWMutex, Semaphore, Election and MultiMutex are
// public types over engines.
type engine struct {
	name       string // the lock's name, as observers and logs call it
	cfg        config
	fleet      // the nodes, and how they are reached
	scriptArgs // what the scripts are given, settled by newEngine
	// waiterID names m in the waiters' queues while it waits. One id per
	// NetMutex is enough: only the goroutine that owns m waits in Redis.
	waiterID string
	waitChan string // its own release channel, p{name}:released:<waiterID>
	// alsoChans, for a MultiMutex's engine: the release channels of its
	// other names, which its waiter watches too; nil otherwise.
	alsoChans []string
	// kind is the kind of lock m acquires: a NetMutex's, a NetRWMutex's
	// read lease or write lock; nil for a Semaphore's engine, which
	// acquires by its own calls. leaseKind is its holds' kind: kind, or a
	// Semaphore's lease.
	kind      kind
	leaseKind leaseKind
	// opt is what the kind does of the optional interfaces (see
	// kindOptions), among them its local admission rule: whom of the local
	// line a hold of the process serves (see localRule).
	opt kindOptions

	// mu guards line, and the kinds' state of the process's holds and
	// waits.
	mu sync.Mutex
	line

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

	reaper reaper   // releases still to deliver
	dog    watchdog // the timer of m's holds
}

// A fleet is the nodes of an engine, what it knows of each, and its clock.
type fleet struct {
	nodes  []Backend
	quorum int
	hubs   []*Hub // per node: its Backend's pub/sub hub, nil if it has none
	// limiters: per node, its Backend's bound on calls in flight (its
	// Hub's), nil if it has no Hub.
	limiters []*limiter
	// grants: a release may grant a waiter of m the lock in its own script
	// (one node, whose hub lets PUBLISH or SPUBLISH count the listeners,
	// and no WithSyncReplicas; see lua/handon.lua), sparing it the acquire
	// round trip.
	grants bool
	// lazyBounds: every node is a Backend of netlock's own, whose calls
	// are bounded by a callBound (see engine.bound).
	lazyBounds bool
	// pipelined: the nodes, more than one, are all pipeliners (redigo), and
	// no call waits for replicas: a fanout sends its calls before it reads
	// their replies, on the calling goroutine (see fanoutPipelined).
	pipelined bool
	epoch     time.Time
	// clk is the time of m's holds and waits: the real clock, or the one
	// package netlocktest attached to a Backend (see internal/clock).
	clk       clock.Clock
	driftTerm time.Duration
	checked   atomic.Bool // checkServers has run
}

// scriptArgs are the keys and arguments of an engine's scripts that do not
// change: the kind's spec and the options settle them in newEngine.
type scriptArgs struct {
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
	// tombPrefix is the tombstone keys' common part: a value's tombstone
	// key is tombPrefix+value (see freshValue).
	tombPrefix string
	// freeArg is the acquire script's last argument for an uncontended
	// attempt on one node: ":<holder>", all it needs (see lua/acquire.lua).
	freeArg string
	// wakeTries is how many queued waiters a release tries in a row,
	// skipping those nobody listens for (releaseWakeTries); 1 where a
	// node's hub cannot tell (PUBLISH does not count them: a Redis Cluster
	// without sharded pub/sub), as a string for the scripts.
	wakeTries string
}

// A line is the local queue of an engine (see local.go), guarded by its mu.
type line struct {
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
}

// newCheckedConfig checks New's name and backends, and returns the
// configuration opts make: every kind's constructor starts with it.
func newCheckedConfig(name string, backends []Backend, opts []Option) (config, error) {
	if err := checkNew(name, backends); err != nil {
		return config{}, err
	}
	return newConfig(opts)
}

// A spec is what a kind settles before its engine is built: the keys and
// channels of its lock, and the kind itself. Fields left zero take the
// NetMutex's choice.
type spec struct {
	// display is what observers and logs call the lock (a MultiMutex's
	// names together); the name given to newEngine if empty.
	display string
	keys    keys
	// tombPrefix is the common part of the tombstone keys (see
	// engine.tombPrefix); keys.tomb("") if empty.
	tombPrefix string
	// waitChan returns the channel a waiter of the engine listens on,
	// given its id and whether a release may grant it the hold (see
	// engine.grants); keys.channel+":"+waiterID if nil.
	waitChan func(waiterID string, grants bool) string
	// leases: the values of the kind's holds carry the holder (see
	// engine.valueSuffix).
	leases bool
	// noGrants: a release never grants this kind's waiters the hold in
	// its own script, whatever the nodes allow.
	noGrants bool
	// kind returns the kind of lock the engine m acquires and holds.
	kind func(m *engine) kind
	// lease and rule, for a kind that acquires by calls of its own (a
	// Semaphore, whose kind is nil): its holds' kind and its local rule.
	lease leaseKind
	rule  localRule
}

// An alsoWatcher is a kind whose waiter watches, besides its own channel,
// the release channels of other locks (a MultiMutex's other names).
type alsoWatcher interface {
	alsoChannels() []string
}

// newEngine returns the engine of a lock called name on backends, with
// cfg, running the kind of sp. It does not contact Redis.
func newEngine(name string, backends []Backend, cfg config, sp spec) (*engine, error) {
	clk := clock.Of(backends)
	m := &engine{
		name: cmp.Or(sp.display, name),
		cfg:  cfg,
		fleet: fleet{
			nodes:     append([]Backend(nil), backends...),
			quorum:    len(backends)/2 + 1,
			hubs:      make([]*Hub, len(backends)),
			limiters:  make([]*limiter, len(backends)),
			epoch:     clk.Now(),
			clk:       clk,
			driftTerm: cfg.driftTerm(),
		},
		scriptArgs: scriptArgs{
			keys:     sp.keys,
			expiryMS: strconv.FormatInt(cfg.expiry.Milliseconds(), 10),
			tombMS:   strconv.FormatInt(tombstoneExpiries*cfg.expiry.Milliseconds(), 10),
			queueMS:  strconv.FormatInt(queueExpiries*cfg.expiry.Milliseconds(), 10),
			holder:   keyspace.HolderEncode(cfg.holderInfo),
		},
		waiterID: rand.Text(),
	}
	m.dog.clk = clk
	m.extendKeys = []string{m.keys.lock, m.keys.waiters}
	m.tombPrefix = cmp.Or(sp.tombPrefix, m.keys.tomb(""))
	m.freeArg = ":" + m.holder
	if sp.leases {
		m.valueSuffix = keyspace.LeaseSuffix(m.holder)
	}
	if err := m.useHubs(); err != nil {
		return nil, err
	}
	m.lazyBounds = !slices.ContainsFunc(m.nodes, func(b Backend) bool { return !lazyBound(b) })
	m.pipelined = len(m.nodes) > 1 && cfg.replicas == 0 && !slices.ContainsFunc(m.nodes, func(b Backend) bool {
		_, ok := b.(pipeliner)
		return !ok
	})
	// With WithSyncReplicas, a waiter acquires for itself: a grant made by
	// the releaser's script would be a hold no replica was asked to
	// acknowledge.
	m.grants = !sp.noGrants && len(backends) == 1 && m.hubs[0] != nil && m.hubs[0].counted && cfg.replicas == 0
	m.waitChan = m.keys.channel + ":" + m.waiterID
	if sp.waitChan != nil {
		m.waitChan = sp.waitChan(m.waiterID, m.grants)
	}
	if sp.kind == nil {
		m.leaseKind, m.opt = sp.lease, optionsOf(sp.lease, sp.rule)
		return m, nil
	}
	k := sp.kind(m)
	m.kind, m.leaseKind, m.opt = k, k, optionsOf(k, nil)
	if w, ok := k.(alsoWatcher); ok {
		m.alsoChans = w.alsoChannels()
	}
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
func (m *engine) useHubs() error {
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

// token is NetMutex.Token.
func (m *engine) token() uint64 {
	if h := m.current(); h != nil {
		return h.token
	}
	return 0
}

// lostChan is NetMutex.Lost.
func (m *engine) lostChan() <-chan struct{} {
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

func (m *engine) current() *hold {
	if m == nil {
		return nil // a nil *NetMutex holds nothing, like the zero value
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hold
}

// errZero is returned by a NetMutex that was not made by New or Client.Mutex.
var errZero = errors.New("netlock: NetMutex not created by New or Client.Mutex (the zero value is not usable)")

func (m *engine) check() error {
	if m == nil || m.nodes == nil {
		return errZero
	}
	return nil
}
