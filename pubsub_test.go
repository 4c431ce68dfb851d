package netlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// A waiter subscribed to the release channel makes no attempt while the
// holder holds, however long that is, and one as soon as it releases. The
// retry delay is long (seconds), so an attempt count of three (the failed
// first, the one right after subscribing, the winning one) means the wake-up
// came from the release message; polling, even with exponential backoff,
// makes about ten attempts while the holder sleeps.
func TestWaiterWakesOnRelease(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		holder := e.newMutex(t, "wake")
		waiter, cb := waitingMutex(t, e, "wake")
		mustLock(t, holder)
		locked := lockInBackground(t, waiter, cb)
		time.Sleep(150 * time.Millisecond) // polling would attempt here
		if n := cb.count("acquire"); n != 2 {
			t.Errorf("attempts while the lock was held: got %d, want 2", n)
		}
		mustUnlock(t, holder)
		redistest.Within(t, 5*time.Second, "LockCtx after the release", func() {
			if err := <-locked; err != nil {
				t.Errorf("LockCtx: %v", err)
			}
		})
		// Granted the lock by the release, it needs no third attempt
		// (where a release can grant).
		want := 3
		if waiter.grants {
			want = 2
		}
		if n := cb.count("acquire"); n != want {
			t.Errorf("attempts: got %d, want %d", n, want)
		}
		mustUnlock(t, waiter)
	})
}

// The same wait on a Backend that cannot subscribe polls: this is what the
// test above tells apart.
func TestWaiterPollsWithoutPubSub(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		holder := e.newMutex(t, "poll")
		cb := counting(e.backend(t))
		cb.polling = true
		waiter, err := New("poll", []Backend{cb}, WithRetryDelay(time.Millisecond, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, holder)
		locked := make(chan error, 1)
		go func() { locked <- waiter.LockCtx(context.Background()) }()
		// Past the attempts where a subscribed waiter would have queued.
		eventually(t, 5*time.Second, "the polling waiter's fourth attempt", func() bool { return cb.count("acquire") >= 4 })
		// It cannot hear its turn, so it does not queue for one.
		if n, _ := redis.Int(e.do(t, "ZCARD", "netlock:{poll}:waiters"), nil); n != 0 {
			t.Errorf("a polling waiter queued: %d ids in the waiters' queue, want 0", n)
		}
		mustUnlock(t, holder)
		if err := <-locked; err != nil {
			t.Fatalf("LockCtx: %v", err)
		}
		if n := cb.count("acquire"); n <= 3 {
			t.Errorf("attempts while polling: got %d, want more than 3", n)
		}
		mustUnlock(t, waiter)
	})
}

// A lock that expires without a release publishes nothing; the waiter still
// wakes, when the holder's TTL runs out, not after its (long) retry delay.
func TestWaiterWakesOnExpiry(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		holder := e.newMutex(t, "expiry", WithExpiry(300*time.Millisecond), WithAutoExtend(false), WithNodeTimeout(100*time.Millisecond))
		cb := counting(e.backend(t))
		waiter, err := New("expiry", []Backend{cb}, WithRetryDelay(time.Millisecond, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, holder) // and never unlocked: it expires
		redistest.Within(t, 5*time.Second, "LockCtx after the expiry", func() { mustLock(t, waiter) })
		// The failed first attempt, the one after subscribing, then one
		// when the TTL ran out (two if Redis had not yet expired the key
		// at the millisecond it reported).
		if n := cb.count("acquire"); n < 3 || n > 4 {
			t.Errorf("attempts: got %d, want 3 or 4", n)
		}
		mustUnlock(t, waiter)
		if err := holder.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("holder's UnlockCtx: got %v, want ErrLockLost", err)
		}
	})
}

// Many waiters on one Backend share one pub/sub connection, each NetMutex
// with its own subscription; when they are done (acquired, cancelled),
// nothing stays subscribed and the connection is closed.
func TestWaitersShareOneSubscription(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const waiters = 12
		holder := e.newMutex(t, "shared")
		b := e.backend(t)
		h := b.(Subscriber).Hub()
		ms := make([]*NetMutex, waiters)
		for i := range ms {
			m, err := New("shared", []Backend{b}, WithRetryDelay(time.Millisecond, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			ms[i] = m
		}
		mustLock(t, holder)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errs := make(chan error, waiters)
		for i, m := range ms {
			go func() {
				c := context.Background()
				if i%3 == 0 {
					c = ctx // cancelled midway
				}
				err := m.LockCtx(c)
				if err == nil {
					err = m.UnlockCtx(context.Background())
				}
				errs <- err
			}()
		}
		eventually(t, 5*time.Second, "every waiter subscribed", func() bool {
			h.wmu.Lock()
			defer h.wmu.Unlock()
			n := 0
			for _, m := range ms {
				if tp := h.topics[m.waitChan]; tp != nil {
					n += len(tp.watches)
				}
			}
			return n == waiters
		})
		if n := pubsubClients(t, e); n != 1 {
			t.Errorf("pub/sub connections while %d wait: got %d, want 1", waiters, n)
		}
		for i, m := range ms {
			if n := numsub(t, e, m.waitChan); n != 1 {
				t.Errorf("waiter %d: subscriptions to its channel: got %d, want 1", i, n)
			}
		}
		cancel()
		mustUnlock(t, holder)
		for range waiters {
			if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("waiter: %v", err)
			}
		}
		eventually(t, 5*time.Second, "channels unsubscribed", func() bool {
			for _, m := range ms {
				if numsub(t, e, m.waitChan) != 0 {
					return false
				}
			}
			return true
		})
		eventually(t, 5*time.Second, "pub/sub connection closed", func() bool {
			h.mu.Lock()
			defer h.mu.Unlock()
			return len(h.links) == 0
		})
		h.mu.Lock()
		defer h.mu.Unlock()
		h.wmu.Lock()
		defer h.wmu.Unlock()
		if len(h.topics) != 0 {
			t.Errorf("hub after the waits: %d topics; want none", len(h.topics))
		}
	})
}

// A waiter whose pub/sub connection is killed (CLIENT KILL TYPE pubsub) is
// woken, subscribes again and is woken by the next release.
func TestWaiterSurvivesPubSubConnectionLoss(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		holder := e.newMutex(t, "killed")
		waiter, cb := waitingMutex(t, e, "killed")
		mustLock(t, holder)
		locked := lockInBackground(t, waiter, cb)
		e.do(t, "CLIENT", "KILL", "TYPE", "pubsub")
		eventually(t, 5*time.Second, "the waiter subscribed again", func() bool {
			return numsub(t, e, waiter.waitChan) == 1 && cb.count("acquire") >= 3
		})
		mustUnlock(t, holder)
		redistest.Within(t, 5*time.Second, "LockCtx after the release", func() {
			if err := <-locked; err != nil {
				t.Errorf("LockCtx: %v", err)
			}
		})
		mustUnlock(t, waiter)
	})
}

// An Unlock whose release woke a subscribed waiter of another client to
// attempt lets it go first: an immediate Lock of the releasing client
// yields. (A release that grants the lock to the waiter needs no yield:
// grants are turned off here, as for a quorum's waiter.)
func TestUnlockYieldsToSubscribedWaiters(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		a := e.newMutex(t, "yield")
		b, cb := waitingMutex(t, e, "yield")
		b.grants = false
		mustLock(t, a)
		if a.yieldUntil.Load() != 0 {
			t.Fatal("yield set before any release")
		}
		locked := lockInBackground(t, b, cb)
		// Its second attempt has been sent; wait until it has queued.
		eventually(t, 5*time.Second, "the waiter queued", func() bool {
			n, _ := redis.Int(e.do(t, "ZCARD", b.keys.waiters), nil)
			return n == 1
		})
		mustUnlock(t, a)
		if a.yieldUntil.Load() == 0 {
			t.Errorf("no yield after a release that reached a subscribed waiter")
		}
		if err := <-locked; err != nil {
			t.Fatal(err)
		}
		mustUnlock(t, b)
	})
}

// pubsubClients counts the server's pub/sub connections.
func pubsubClients(t testing.TB, e *env) int {
	t.Helper()
	list, err := redis.String(e.do(t, "CLIENT", "LIST", "TYPE", "pubsub"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(list, "\n")
}

// A release wakes only the waiter that has waited longest (the waiters'
// queue names it in the message): the others make no attempt, and the lock
// goes round in order of arrival. A waiter that gives up leaves the queue.
func TestReleaseWakesLongestWaiter(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		holder := e.newMutex(t, "fifo")
		mustLock(t, holder)
		const n = 3
		cbs := make([]*countingBackend, n)
		ms := make([]*NetMutex, n)
		locked := make([]<-chan error, n)
		for i := range ms {
			ms[i], cbs[i] = waitingMutex(t, e, "fifo")
			locked[i] = lockInBackground(t, ms[i], cbs[i])
		}
		// One more that gives up: it must leave the queue.
		q, quitter := waitingMutex(t, e, "fifo")
		ctx, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan error, 1)
		go func() { gaveUp <- q.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "quitter queued", func() bool { return quitter.count("acquire") >= 1 })
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Fatalf("quitter: got %v, want context.Canceled", err)
		}
		queue, err := redis.Strings(e.do(t, "ZRANGE", "netlock:{fifo}:waiters", 0, -1), nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, member := range queue {
			queue[i], _, _ = strings.Cut(member, "+") // "<id>+<expiry>+<nonce>": the id
		}
		want := []string{ms[0].waiterID, ms[1].waiterID, ms[2].waiterID}
		if !slices.Equal(queue, want) {
			t.Fatalf("waiters' queue: got %v, want %v (arrival order, without the one that gave up)", queue, want)
		}

		prev := holder
		for i := range ms {
			before := make([]int, n)
			for j := range cbs {
				before[j] = cbs[j].count("acquire")
			}
			mustUnlock(t, prev)
			redistest.Within(t, 5*time.Second, "the longest waiter's LockCtx", func() {
				if err := <-locked[i]; err != nil {
					t.Fatalf("waiter %d: %v", i, err)
				}
			})
			// Granted the lock by the release itself, it makes no attempt
			// (where a release can grant; else one).
			want := 1
			if ms[i].grants {
				want = 0
			}
			if got := cbs[i].count("acquire") - before[i]; got != want {
				t.Errorf("waiter %d: %d attempts after the release, want %d", i, got, want)
			}
			for j := i + 1; j < n; j++ {
				if got := cbs[j].count("acquire") - before[j]; got != 0 {
					t.Errorf("release %d: waiter %d, not first in line, made %d attempts", i, j, got)
				}
			}
			prev = ms[i]
		}
		mustUnlock(t, prev)
	})
}
