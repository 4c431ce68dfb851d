package netlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// A MultiMutex locks several names at once, all or nothing: it holds the
// locks of all its names, or of none. Its lock of each name is a NetMutex's
// (the same keys and values), so a MultiMutex excludes every NetMutex of
// any of its names, and every MultiMutex that shares a name with it,
// whatever the order in which each was given its names: it never
// deadlocks.
//
// Its methods are a NetMutex's, with the same contracts: Lock, Unlock and
// TryLock make it a sync.Locker; LockCtx, TryLockCtx, UnlockCtx and
// ExtendCtx return errors instead of panicking and honour ctx; after any
// failure or cancellation no name is left held on any node. One watchdog
// extends all the names together, and Lost tells when the hold of the set
// ends. Goroutines of one process that share a MultiMutex queue for it
// locally, as they do for a NetMutex.
//
// On one server, or for names in one hash slot of a Redis Cluster, one
// script per node takes every name if every one is free, and none
// otherwise; a waiter queues for the name it found held, as a NetMutex's
// waiter does, and is woken by that name's release. On a Redis Cluster,
// names in several hash slots are taken one slot at a time, in the order of
// the slots, and a MultiMutex holds none of them while it waits for a
// slot's names held by another. Give names a common hash tag
// ("{order:7}:stock", "{order:7}:payment") to have one script do it all.
// See docs/multi.md.
//
// A MultiMutex must be created with NewMulti and must not be copied after
// first use.
type MultiMutex struct {
	m     multiLock // oneSlot, or slotGroups (multi_slots.go)
	names []string  // as given to NewMulti
}

var _ sync.Locker = (*MultiMutex)(nil)

// A multiLock is how a MultiMutex takes its names: one script per node
// (oneSlot), or one per hash slot of a Redis Cluster (slotGroups).
type multiLock interface {
	lockCtx(ctx context.Context) error
	tryLockCtx(ctx context.Context) (bool, error)
	unlockCtx(ctx context.Context) error
	extendCtx(ctx context.Context) error
	lostChan() <-chan struct{}
	// tokens returns the current hold's tokens, per name in the order
	// given to NewMulti; nil when not locked.
	tokens() []uint64
}

// oneSlot is a MultiMutex whose names one script takes on each node: a
// NetMutex running a multiKind.
type oneSlot struct {
	*engine
	n int // how many names
}

func (o oneSlot) tokens() []uint64 {
	h := o.current()
	if h == nil {
		return nil
	}
	tokens := make([]uint64, o.n)
	for i := range tokens {
		tokens[i] = h.token
	}
	return tokens
}

// NewMulti returns a MultiMutex for the locks called names on backends (one
// backend, or the independent deployments of a quorum, as New takes them),
// with New's options. It returns an error naming what is wrong: no names, a
// name given twice, a name New would refuse, or backends or options New
// would refuse. It does not contact Redis.
//
// On a Backend that says it is a Redis Cluster (as NewRueidis and the
// goredis package say of a cluster client, through their Hub), names in
// several hash slots are taken one slot at a time (see MultiMutex). On a
// Backend of a Cluster that does not say so, LockCtx and TryLockCtx of
// such names return the server's CROSSSLOT error at once.
func NewMulti(names []string, backends []Backend, opts ...Option) (*MultiMutex, error) {
	if len(names) == 0 {
		return nil, errors.New("netlock: NewMulti: no names")
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	for i, name := range names {
		if err := checkName(name); err != nil {
			return nil, fmt.Errorf("netlock: NewMulti: name %d: %w", i, err)
		}
	}
	for i := 1; i < len(sorted); i++ {
		if sorted[i-1] == sorted[i] {
			return nil, fmt.Errorf("netlock: NewMulti: name %q given twice", sorted[i])
		}
	}
	m, err := newMultiEngine(sorted, strings.Join(names, ","), backends, opts)
	if err != nil {
		return nil, err
	}
	if bySlot := m.kind.(*multiKind).slotGroups(); len(bySlot) > 1 {
		s, err := newSlotGroups(names, bySlot, backends, opts, m.cfg.autoExtend)
		if err != nil {
			return nil, err
		}
		return &MultiMutex{m: s, names: slices.Clone(names)}, nil
	}
	return &MultiMutex{m: oneSlot{m, len(names)}, names: slices.Clone(names)}, nil
}

// newMultiEngine returns a NetMutex running a multiKind over sorted, a
// MultiMutex's names in sorted order, that observers and logs call name.
func newMultiEngine(sorted []string, name string, backends []Backend, opts []Option) (*engine, error) {
	cfg, err := newCheckedConfig(sorted[0], backends, opts)
	if err != nil {
		return nil, err
	}
	return newEngine(sorted[0], backends, cfg, spec{
		display: name,
		keys:    newKeys(cfg.prefix, sorted[0], cfg.fencing),
		// A release of one name cannot grant a MultiMutex all of them:
		// its waiter is told its turn and attempts.
		noGrants: true,
		kind:     func(m *engine) kind { return newMultiKind(m, sorted) },
	})
}

// Multi returns a MultiMutex of names on c's backends, with c's options
// followed by opts. Unlike Mutex, it returns a new MultiMutex every time.
// Its errors are NewMulti's.
func (c *Client) Multi(names []string, opts ...Option) (*MultiMutex, error) {
	if c == nil || c.mutexes == nil {
		return nil, errZeroClient
	}
	return NewMulti(names, c.backends, c.options(opts)...)
}

// errZeroMulti is returned by a MultiMutex not made by NewMulti.
var errZeroMulti = errors.New("netlock: MultiMutex not created by NewMulti (the zero value is not usable)")

func (mm *MultiMutex) lock() (multiLock, error) {
	if mm == nil || mm.m == nil {
		return nil, errZeroMulti
	}
	return mm.m, nil
}

// Names returns the names, in the order given to NewMulti.
func (mm *MultiMutex) Names() []string {
	if mm == nil {
		return nil
	}
	return slices.Clone(mm.names)
}

// Lock locks every name of mm, blocking until all are acquired together,
// however long that takes. It panics with the error if acquiring fails for
// another reason than contention, as NetMutex.Lock does.
func (mm *MultiMutex) Lock() {
	if err := mm.LockCtx(context.Background()); err != nil {
		panic(err)
	}
}

// TryLock tries once, without waiting, to lock every name of mm, and
// reports whether it did; when it did not, it holds none. It panics with
// the error if Redis could not be asked.
func (mm *MultiMutex) TryLock() bool {
	ok, err := mm.TryLockCtx(context.Background())
	if err != nil {
		panic(err)
	}
	return ok
}

// Unlock unlocks every name of mm. Like sync.Mutex.Unlock, it panics only on
// misuse (mm not locked: a panic whose value matches ErrNotHeld); what Redis
// does is logged, as NetMutex.Unlock does.
func (mm *MultiMutex) Unlock() {
	m, err := mm.lock()
	if err != nil {
		panic(err)
	}
	if err := m.unlockCtx(context.Background()); errors.Is(err, ErrNotHeld) {
		panic(errUnlockUnlocked)
	}
}

// LockCtx locks every name of mm, waiting while any is held elsewhere,
// until ctx ends. It returns nil when all are held. Otherwise it returns
// NetMutex.LockCtx's errors, and holds none of the names on any node: a
// cancelled or failed call leaves nothing behind, and no place in a
// waiters' queue.
func (mm *MultiMutex) LockCtx(ctx context.Context) error {
	m, err := mm.lock()
	if err != nil {
		return err
	}
	return m.lockCtx(ctx)
}

// TryLockCtx tries once to lock every name of mm, without waiting for
// another holder. It returns (true, nil) when all are held; (false, nil)
// when any is held by another goroutine of this process or another client;
// and (false, err) when the attempt could not be made. When it returns
// false, none of the names is held. ctx bounds the one attempt.
func (mm *MultiMutex) TryLockCtx(ctx context.Context) (bool, error) {
	m, err := mm.lock()
	if err != nil {
		return false, err
	}
	return m.tryLockCtx(ctx)
}

// UnlockCtx unlocks every name of mm, as NetMutex.UnlockCtx does: it
// returns ErrNotHeld if mm is not locked, and ErrLockLost if the hold of
// any name had been lost; whatever it returns, mm is unlocked in this
// process afterwards.
func (mm *MultiMutex) UnlockCtx(ctx context.Context) error {
	m, err := mm.lock()
	if err != nil {
		return err
	}
	return m.unlockCtx(ctx)
}

// ExtendCtx resets every name's TTL to the full expiry, only if every one
// is still held: it returns ErrLockLost if any was lost, ErrNotHeld if mm
// is not locked. On one server or for names in one hash slot it then
// extends none; for names in several slots of a Redis Cluster, those of
// the other slots may have been extended, and go with Unlock. With
// auto-extend on (the default) there is no need to call it.
func (mm *MultiMutex) ExtendCtx(ctx context.Context) error {
	m, err := mm.lock()
	if err != nil {
		return err
	}
	return m.extendCtx(ctx)
}

// Lost returns a channel closed when the hold of the set ends without this
// client's say (its deadline passed without an extend, or an extend found
// a name gone or taken), or is released. When mm is not locked, Lost
// returns a closed channel.
func (mm *MultiMutex) Lost() <-chan struct{} {
	if mm == nil || mm.m == nil {
		return closedChan
	}
	return mm.m.lostChan()
}

// Tokens returns the fencing tokens of the current hold, one per name in
// the order given to NewMulti; nil when mm is not locked. Each is a
// NetMutex's token for its name: it strictly increases with every
// acquisition of that name, by a NetMutex or a MultiMutex. The names taken
// by one script (all, or those of one hash slot of a Redis Cluster) share
// one token, drawn above the counters of all their slots. All are 0 with
// fencing off.
func (mm *MultiMutex) Tokens() []uint64 {
	if mm == nil || mm.m == nil {
		return nil
	}
	return mm.m.tokens()
}

// multiKind is the kind of a MultiMutex: the keys of a NetMutex for each
// name, taken, extended and released together (lua/multi_acquire.lua,
// multi_release.lua, multi_extend.lua, multi_leave.lua). Names are in
// sorted order.
type multiKind struct {
	m        *engine
	names    []string
	locks    []string
	waiters  []string
	fences   []string // per name, its slot's counter; nil with fencing off
	channels []string // per name, our release channel, p{name}:released:<waiter id>
	n        string   // len(names), as the scripts take it
}

// multiKind's waiters queue as a NetMutex's.
func newMultiKind(m *engine, names []string) *multiKind {
	k := &multiKind{m: m, names: names, n: strconv.Itoa(len(names))}
	for _, name := range names {
		ks := keyspace.New(m.cfg.prefix, name, m.cfg.fencing)
		k.locks = append(k.locks, ks.Lock)
		k.waiters = append(k.waiters, ks.Waiters)
		k.channels = append(k.channels, ks.Channel+":"+m.waiterID)
		if ks.Fence != "" {
			k.fences = append(k.fences, ks.Fence)
		}
	}
	return k
}

// slotGroups returns k's names grouped by hash slot, in the order of the
// slots, on a Backend known to be a Redis Cluster (by its Hub), where one
// script cannot touch keys of several slots; nil otherwise. (A Backend
// that does not say gets the server's CROSSSLOT error from its first
// acquire.)
func (k *multiKind) slotGroups() [][]string {
	if !slices.ContainsFunc(k.m.hubs, func(h *Hub) bool { return h != nil && (h.sharded() || !h.counted) }) {
		return nil
	}
	var slots []uint16
	names := map[uint16][]string{}
	for i, lock := range k.locks {
		slot := keyspace.Slot(lock)
		if names[slot] == nil {
			slots = append(slots, slot)
		}
		names[slot] = append(names[slot], k.names[i]) // in sorted order
	}
	slices.Sort(slots)
	groups := make([][]string, len(slots))
	for i, slot := range slots {
		groups[i] = names[slot]
	}
	return groups
}

func (*multiKind) observed() Kind { return KindMulti }

// keys returns the lock keys, the waiters' queues, the tombstones of value
// and the fence counters, as the acquire and release scripts take them.
func (k *multiKind) keys(value string) []string {
	keys := make([]string, 0, 4*len(k.names))
	keys = append(keys, k.locks...)
	keys = append(keys, k.waiters...)
	for _, lock := range k.locks {
		keys = append(keys, keyspace.Tomb(lock, value))
	}
	return append(keys, k.fences...)
}

func (k *multiKind) acquireCall(value, _, proposal string, q ask) (*Script, []string, []string) {
	m := k.m
	return multiAcquireScript, k.keys(value), []string{value, m.expiryMS, m.acquireArg(proposal, q), m.wakeTries, k.n}
}

func (k *multiKind) releaseCall(value, _ string) (*Script, []string, []string) {
	m := k.m
	return multiReleaseScript, k.keys(value), []string{value, m.tombMS, m.wakeTries, k.n}
}

func (k *multiKind) extendCall(value string) (*Script, []string, []string) {
	return k.keepCall(value, k.m.cfg.expiry.Milliseconds())
}

func (k *multiKind) keepCall(value string, ms int64) (*Script, []string, []string) {
	keys := append(slices.Clip(k.locks), k.waiters...)
	return multiExtendScript, keys, []string{value, strconv.FormatInt(ms, 10), k.m.queueMS}
}

func (k *multiKind) leaveCall(member string) (*Script, []string, []string) {
	keys := append(append(slices.Clip(k.locks), k.waiters...), k.fences...)
	return multiLeaveScript, keys, []string{member, k.m.wakeTries, k.n}
}

// waitFlags are a NetMutex's: join the queue of the name found held while
// listening, at its head if a turn was lost; leave the queues on success.
func (*multiKind) waitFlags(listening, turn, queued bool) string {
	return mutexKind{}.waitFlags(listening, turn, queued)
}

// messageGrant is never called: a release does not grant a MultiMutex.
// alsoChannels returns the release channels of k's names but the first,
// which a waiter watches besides its own (see alsoWatcher).
func (k *multiKind) alsoChannels() []string { return k.channels[1:] }
