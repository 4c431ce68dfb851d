package netlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"pgregory.net/rapid"
)

// TestMultiProperty drives MultiMutexes of overlapping name sets, given in
// different orders, and NetMutexes of single names, each on a client of its
// own, on one and on three miniredis nodes, through random sequences of
// TryLockCtx, LockCtx with a short deadline while a name is held, a LockCtx
// that waits while the holders of its names unlock one by one in random
// order, UnlockCtx and ExtendCtx. The model knows which lock holds each
// name, and every answer is checked against it; after every step, on every
// node, each name's key holds exactly its holder's value and token (nothing
// is left by an Unlock, a refused TryLockCtx or a cancelled LockCtx), and
// every waiters' queue is empty. Each name's tokens strictly increase.
func TestMultiProperty(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) { newMultiMachine(rt, n).run(rt) })
		})
	}
}

// multiMachine is the model of TestMultiProperty, and the locks it drives.
type multiMachine struct {
	nodes  []*miniredis.Miniredis
	locks  []multiPropLock
	holder map[string]int    // name -> index in locks of its holder
	last   map[string]uint64 // name -> highest token seen
}

// A multiPropLock is a MultiMutex or a NetMutex of the model, behind one
// face.
type multiPropLock struct {
	names  []string
	try    func(context.Context) (bool, error)
	lock   func(context.Context) error
	unlock func(context.Context) error
	extend func(context.Context) error
	tokens func() []uint64
	lost   func() <-chan struct{}
	held   bool
	// waiter is its NetMutex's waiter id, which begins its member of the
	// waiters' queues (see lua/acquire.lua);
	// cut, that a LockCtx of it was cut short by its ctx (lockShort).
	waiter string
	cut    bool
}

var multiPropSets = [][]string{{"a", "b"}, {"b", "a"}, {"c", "b", "a"}, {"c", "a"}, {"a"}, {"b"}, {"c"}}

func newMultiMachine(rt *rapid.T, n int) *multiMachine {
	mc := &multiMachine{holder: map[string]int{}, last: map[string]uint64{}}
	for range n {
		s := miniredis.NewMiniRedis()
		if err := s.Start(); err != nil {
			rt.Fatal(err)
		}
		rt.Cleanup(s.Close)
		mc.nodes = append(mc.nodes, s)
	}
	for i, names := range multiPropSets {
		backends := make([]Backend, n)
		for j, s := range mc.nodes {
			addr := s.Addr()
			pool := &redis.Pool{MaxIdle: 4, DialContext: func(ctx context.Context) (redis.Conn, error) { return redis.DialContext(ctx, "tcp", addr) }}
			rt.Cleanup(func() { pool.Close() })
			backends[j] = NewRedigo(pool)
		}
		if len(names) == 1 && i >= 4 {
			m, err := New(names[0], backends)
			if err != nil {
				rt.Fatal(err)
			}
			mc.locks = append(mc.locks, multiPropLock{names: names, try: m.TryLockCtx, lock: m.LockCtx, unlock: m.UnlockCtx, extend: m.ExtendCtx,
				tokens: func() []uint64 { return []uint64{m.Token()} }, lost: m.Lost, waiter: m.waiterID})
			continue
		}
		mm, err := NewMulti(names, backends)
		if err != nil {
			rt.Fatal(err)
		}
		mc.locks = append(mc.locks, multiPropLock{names: names, try: mm.TryLockCtx, lock: mm.LockCtx, unlock: mm.UnlockCtx, extend: mm.ExtendCtx,
			tokens: mm.Tokens, lost: mm.Lost, waiter: mm.m.(oneSlot).waiterID})
	}
	rt.Cleanup(func() {
		for i := range mc.locks {
			if mc.locks[i].held {
				mc.locks[i].unlock(context.Background())
			}
		}
	})
	return mc
}

func (mc *multiMachine) run(rt *rapid.T) {
	rt.Repeat(map[string]func(*rapid.T){
		"":               mc.check,
		"tryLock":        mc.tryLock,
		"lockShort":      mc.lockShort,
		"lockWhileFreed": mc.lockWhileFreed,
		"unlock":         mc.unlock,
		"extend":         mc.extend,
	})
}

func (mc *multiMachine) pick(rt *rapid.T) (int, *multiPropLock) {
	i := rapid.IntRange(0, len(mc.locks)-1).Draw(rt, "lock")
	return i, &mc.locks[i]
}

// blockers returns the locks that hold a name of l.
func (mc *multiMachine) blockers(l *multiPropLock) []int {
	var bs []int
	for _, name := range l.names {
		if h, ok := mc.holder[name]; ok && !slices.Contains(bs, h) {
			bs = append(bs, h)
		}
	}
	return bs
}

// took records that lock i now holds its names, and checks its tokens.
func (mc *multiMachine) took(rt *rapid.T, i int) {
	l := &mc.locks[i]
	l.held = true
	toks := l.tokens()
	if len(toks) != len(l.names) {
		rt.Fatalf("lock %d: Tokens() %v for %d names", i, toks, len(l.names))
	}
	for k, name := range l.names {
		if toks[k] <= mc.last[name] {
			rt.Fatalf("lock %d: token %d of %q after %d: must strictly increase", i, toks[k], name, mc.last[name])
		}
		mc.last[name] = toks[k]
		mc.holder[name] = i
	}
}

func (mc *multiMachine) released(i int) {
	l := &mc.locks[i]
	l.held = false
	for _, name := range l.names {
		delete(mc.holder, name)
	}
}

func (mc *multiMachine) tryLock(rt *rapid.T) {
	i, l := mc.pick(rt)
	if l.held {
		rt.Skip("held")
	}
	want := len(mc.blockers(l)) == 0
	ok, err := l.try(context.Background())
	if ok != want || err != nil {
		rt.Fatalf("lock %d %q TryLockCtx: got %v, %v; want %v, nil", i, l.names, ok, err, want)
	}
	if ok {
		mc.took(rt, i)
	}
}

func (mc *multiMachine) lockShort(rt *rapid.T) {
	i, l := mc.pick(rt)
	if l.held || len(mc.blockers(l)) == 0 {
		rt.Skip("held, or free")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rapid.IntRange(1, 30).Draw(rt, "ms"))*time.Millisecond)
	defer cancel()
	// A deadline of a few milliseconds may pass before Redis answers on a
	// loaded machine: then the error says Redis could not be asked in time.
	if err := l.lock(ctx); !errors.Is(err, context.DeadlineExceeded) || !(errors.Is(err, ErrNotObtained) || errors.Is(err, ErrQuorum)) {
		rt.Fatalf("lock %d %q LockCtx while held elsewhere: got %v, want DeadlineExceeded, and ErrNotObtained or ErrQuorum", i, l.names, err)
	}
	l.cut = true
}

// lockWhileFreed starts a LockCtx of a lock whose names are held, waits
// until it has queued, then unlocks the holders one by one in random
// order: it must get in.
func (mc *multiMachine) lockWhileFreed(rt *rapid.T) {
	i, l := mc.pick(rt)
	bs := mc.blockers(l)
	if l.held || len(bs) == 0 {
		rt.Skip("held, or free")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.lock(ctx) }()
	if len(mc.nodes) == 1 {
		// Over a quorum a waiter may not queue: where a minority node
		// lacks a holder's key (its release of the last holder came
		// late), its attempts split the votes, and it retries without a
		// place until the holder unlocks.
		eventually(rt, 5*time.Second, "the waiter queued", mc.queued)
	}
	for _, k := range rapid.Permutation(bs).Draw(rt, "unlock order") {
		if err := mc.locks[k].unlock(context.Background()); err != nil {
			rt.Fatalf("lock %d UnlockCtx: %v", k, err)
		}
		mc.released(k)
	}
	if err := <-done; err != nil {
		rt.Fatalf("lock %d %q LockCtx once its names were freed: %v", i, l.names, err)
	}
	mc.took(rt, i)
}

func (mc *multiMachine) unlock(rt *rapid.T) {
	i, l := mc.pick(rt)
	err := l.unlock(context.Background())
	switch {
	case l.held && err != nil:
		rt.Fatalf("lock %d UnlockCtx: %v", i, err)
	case !l.held && !errors.Is(err, ErrNotHeld):
		rt.Fatalf("lock %d UnlockCtx not held: got %v, want ErrNotHeld", i, err)
	}
	if l.held {
		mc.released(i)
	}
}

func (mc *multiMachine) extend(rt *rapid.T) {
	i, l := mc.pick(rt)
	err := l.extend(context.Background())
	switch {
	case l.held && err != nil:
		rt.Fatalf("lock %d ExtendCtx: %v", i, err)
	case !l.held && !errors.Is(err, ErrNotHeld):
		rt.Fatalf("lock %d ExtendCtx not held: got %v, want ErrNotHeld", i, err)
	}
}

// queued reports whether some name's waiters' queue has a member on the
// first node.
func (mc *multiMachine) queued() bool {
	for _, name := range []string{"a", "b", "c"} {
		if members, _ := mc.nodes[0].ZMembers("netlock:{" + name + "}:waiters"); len(members) > 0 {
			return true
		}
	}
	return false
}

// unexplained reports whether member, found in a waiters' queue between
// steps, is not explained by a LockCtx cut short by its ctx: a call of it
// that the ctx cut while on its way may reach the node after the waiter's
// leave, and join the queue then (its place is skipped by the releases,
// and expires). Every other member is a leave that did not happen.
func (mc *multiMachine) unexplained(member string) bool {
	id, _, _ := strings.Cut(member, "+") // on one node, "<id>+<expiry>+<nonce>+<holder>"
	for i := range mc.locks {
		if l := &mc.locks[i]; l.waiter == id {
			return !l.cut
		}
	}
	return true
}

// check compares every node's keys with the model. A held name's key is
// on a quorum of the nodes at least: a minority may have been released
// late by the last holder, after the new one's acquire found it busy there.
func (mc *multiMachine) check(rt *rapid.T) {
	for _, name := range []string{"a", "b", "c"} {
		key := "netlock:{" + name + "}"
		h, held := mc.holder[name]
		on := 0
		for j, s := range mc.nodes {
			v, err := s.Get(key)
			switch {
			case !held && err == nil:
				rt.Fatalf("node %d: %s = %q, held by none in the model", j, key, v)
			case held && err == nil:
				on++
				if f := strings.Split(v, ":"); len(f) < 2 || f[1] != strconv.FormatUint(mc.last[name], 10) { // "<value>:<token>:<holder>"
					rt.Fatalf("node %d: %s = %q, want token %d", j, key, v, mc.last[name])
				}
			}
			if members, _ := s.ZMembers(key + ":waiters"); slices.ContainsFunc(members, mc.unexplained) {
				rt.Fatalf("node %d: %s:waiters = %q between steps, want empty", j, key, members)
			}
		}
		if held && on < len(mc.nodes)/2+1 {
			rt.Fatalf("%s on %d of %d nodes, held by lock %d in the model", key, on, len(mc.nodes), h)
		}
	}
	for i := range mc.locks {
		if mc.locks[i].held != isOpen(mc.locks[i].lost()) {
			rt.Fatalf("lock %d: held %v, Lost() open %v", i, mc.locks[i].held, isOpen(mc.locks[i].lost()))
		}
	}
}
