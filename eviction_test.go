package netlock

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// What a full Redis does to a held lock, on a real server: the two sides of
// the README's advice to run noeviction.

// fillMemory sets maxmemory a little above the memory in use, under policy,
// and writes 16KB values without a TTL until stop reports true or a write
// is refused (noeviction). It returns the number of values written and the
// refusal, if any.
func fillMemory(t *testing.T, e *env, policy string, stop func() bool) (int, error) {
	t.Helper()
	info, _ := redis.String(e.do(t, "INFO", "memory"), nil)
	used := int64(0)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if used == 0 {
		t.Fatalf("INFO memory has no used_memory:\n%s", info)
	}
	e.do(t, "CONFIG", "SET", "maxmemory-policy", policy)
	e.do(t, "CONFIG", "SET", "maxmemory", strconv.FormatInt(used+512<<10, 10))
	t.Cleanup(func() {
		e.do(t, "CONFIG", "SET", "maxmemory", "0")
		e.do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	})
	c, err := redis.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	value := strings.Repeat("x", 16<<10)
	for i := range 1000 { // 16MB: far above the 512KB of headroom
		if stop() {
			return i, nil
		}
		if _, err := c.Do("SET", "fill:"+strconv.Itoa(i), value); err != nil {
			return i, err
		}
	}
	t.Fatalf("1000 values of 16KB written under maxmemory %d+512KB (%s), and neither evicted nor refused", used, policy)
	return 0, nil
}

// Under volatile-lru (the default of some managed services), the lock key is
// the first to go when memory fills: it is the one key with a TTL. Another
// client then gets the lock while the holder still believes it holds it,
// until its next extend finds the key gone: Lost() fires then, within an
// extend interval, with reason "extend". netlock cannot prevent the
// overlap, only report it; hence the warning, and noeviction.
func TestEvictedHoldIsLost(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const expiry = 1500 * time.Millisecond // an extend every 500ms
		var lost = make(chan LostHold, 1)
		logs := &logRecords{level: slog.LevelWarn}
		holder := e.newMutex(t, "evicted", WithExpiry(expiry), WithLogger(slog.New(logs)),
			WithObserver(Observer{Lost: func(l LostHold) { lost <- l }}))
		other := e.newMutex(t, "evicted", WithExpiry(expiry), WithLogger(slog.New(slog.DiscardHandler)))
		mustLock(t, holder)

		n, err := fillMemory(t, e, "volatile-lru", func() bool { return !e.exists(t, holder.keys.lock) })
		if err != nil {
			t.Fatalf("filling memory under volatile-lru: %v", err)
		}
		evicted := time.Now()
		// The server names the policy to the next acquire (the check runs
		// once per Backend, before its first acquire).
		ok, err := other.TryLockCtx(context.Background())
		if err != nil || !ok {
			t.Fatalf("another client's TryLockCtx after the eviction: %v, %v; want the lock (the key is gone)", ok, err)
		}
		select {
		case l := <-lost:
			if l.Reason != LostExtend {
				t.Errorf("Lost reason: got %q, want %q", l.Reason, LostExtend)
			}
			took := time.Since(evicted)
			if took > expiry/extendsPerExpiry+time.Second {
				t.Errorf("Lost fired %v after the eviction; want within an extend interval (%v)", took, expiry/extendsPerExpiry)
			}
			redistest.Report(t, "eviction (%s): lock key evicted after %d values of 16KB; another client locked at once; the holder was told %v later (reason %s)",
				e.client, n, took.Round(time.Millisecond), l.Reason)
		case <-time.After(expiry + time.Second):
			t.Fatal("the holder was not told its key was evicted")
		}
		if err := holder.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("holder's UnlockCtx: got %v, want ErrLockLost", err)
		}
		mustUnlock(t, other)
		if len(logs.find(slog.LevelWarn, "maxmemory-policy")) != 0 {
			// The holder's check ran before maxmemory was set: nothing to
			// say then. (TestEvictionPolicyWarned covers the warning.)
			t.Errorf("holder warned about a policy set after its first acquire")
		}
	})
}

// Under noeviction a full Redis refuses writes that grow memory, and lock
// keys stay: a hold keeps being extended (PEXPIRE is allowed when out of
// memory), its release works, and a new acquire fails at once with the
// server's OOM error instead of waiting: nothing is held twice.
func TestMemoryFullNoeviction(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const expiry = 1500 * time.Millisecond
		holder := e.newMutex(t, "full", WithExpiry(expiry), WithLogger(slog.New(slog.DiscardHandler)))
		// other's LockCtx must listen to join the queue (the write that is
		// refused): a node timeout of its own, not the expiry's tenth
		// (150ms), so that a loaded machine (CI, -race, packages in
		// parallel) does not make its subscription time out and it poll
		// (CI saw a rueidis subscription on the client's own connection
		// miss 1s there); its expiry only has to stay above that (it
		// never holds).
		other := e.newMutex(t, "full", WithExpiry(8*time.Second), WithNodeTimeout(3*time.Second), WithLogger(slog.New(slog.DiscardHandler)))
		mustLock(t, holder)
		n, err := fillMemory(t, e, "noeviction", func() bool { return false })
		if err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("filling memory under noeviction: %v; want an OOM refusal", err)
		}

		// Held across several extends.
		select {
		case <-holder.Lost():
			t.Fatal("the hold was lost while Redis was out of memory")
		case <-time.After(2 * expiry):
		}
		if !e.exists(t, holder.keys.lock) {
			t.Fatal("the lock key is gone under noeviction")
		}

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A TryLockCtx of the held lock writes nothing: false, as ever.
		if ok, err := other.TryLockCtx(ctx); ok || err != nil {
			t.Errorf("TryLockCtx of the held lock, out of memory: %v, %v; want false, nil", ok, err)
		}
		// A LockCtx would join the waiters' queue, a write: refused, and
		// reported at once rather than ridden out.
		start := time.Now()
		if err := other.LockCtx(ctx); err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("LockCtx of the held lock, out of memory: %v; want the OOM error", err)
		}
		waitErr := time.Since(start)
		if err := holder.UnlockCtx(ctx); err != nil {
			t.Fatalf("UnlockCtx while out of memory: %v", err)
		}
		// The lock is free now; taking it is a write: refused, at once.
		start = time.Now()
		ok, err := other.TryLockCtx(ctx)
		if ok || err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("TryLockCtx of the free lock, out of memory: %v, %v; want false and the OOM error", ok, err)
		}
		redistest.Report(t, "memory full (%s, noeviction, after %d values of 16KB): the hold kept through %v of extends and released; LockCtx refused with OOM in %v, TryLockCtx of the free lock in %v",
			e.client, n, 2*expiry, waitErr.Round(100*time.Microsecond), time.Since(start).Round(100*time.Microsecond))
		if e.exists(t, holder.keys.lock) {
			t.Error("the lock key is still there after the release")
		}
	})
}

// Under noeviction a full Redis still lets a release hand the lock on to a
// waiter queued before memory filled: the release's first write takes the
// waiter off the queue (it frees memory), and the writes after it are let
// through (Redis refuses only a script's first write that may grow
// memory).
func TestMemoryFullReleaseHandsOn(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		holder := e.newMutex(t, "fullhand", WithLogger(slog.New(slog.DiscardHandler)))
		waiter := e.newMutex(t, "fullhand", WithNodeTimeout(3*time.Second), WithLogger(slog.New(slog.DiscardHandler)))
		mustLock(t, holder)
		done := async(waiter.LockCtx)
		eventually(t, 5*time.Second, "the waiter queued", func() bool {
			n, _ := redis.Int(e.do(t, "ZCARD", waiter.keys.waiters), nil)
			return n == 1
		})
		if _, err := fillMemory(t, e, "noeviction", func() bool { return false }); err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("filling memory under noeviction: %v; want an OOM refusal", err)
		}
		start := time.Now()
		if err := holder.UnlockCtx(context.Background()); err != nil {
			t.Fatalf("UnlockCtx with a waiter queued, out of memory: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("the waiter's LockCtx, out of memory: %v", err)
		}
		redistest.Report(t, "memory full (%s, noeviction): the release handed the lock to the queued waiter in %v", e.client, time.Since(start).Round(100*time.Microsecond))
		mustUnlock(t, waiter)
	})
}
