package netlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestMultiExcludesNetMutex(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		ctx := context.Background()
		mm := e.newMulti(t, []string{"b", "a"})
		a, b, c := e.newMutex(t, "a"), e.newMutex(t, "b"), e.newMutex(t, "c")
		if ok, err := mm.TryLockCtx(ctx); !ok || err != nil {
			t.Fatalf("TryLockCtx: got %v, %v; want true, nil", ok, err)
		}
		for _, m := range []*NetMutex{a, b} {
			if ok, err := m.TryLockCtx(ctx); ok || err != nil {
				t.Errorf("NetMutex %q TryLockCtx under the MultiMutex: got %v, %v; want false, nil", m.Name(), ok, err)
			}
		}
		if ok, err := c.TryLockCtx(ctx); !ok || err != nil {
			t.Errorf("NetMutex c TryLockCtx: got %v, %v; want true, nil", ok, err)
		}
		mustUnlock(t, c)
		if err := mm.UnlockCtx(ctx); err != nil {
			t.Fatalf("UnlockCtx: %v", err)
		}
		for _, k := range []string{"netlock:{a}", "netlock:{b}"} {
			if e.exists(t, k) {
				t.Errorf("%s exists after UnlockCtx", k)
			}
		}

		// A NetMutex of one name keeps the MultiMutex out, and the
		// MultiMutex takes none of its names.
		mustLock(t, b)
		if ok, err := mm.TryLockCtx(ctx); ok || err != nil {
			t.Fatalf("TryLockCtx with b held: got %v, %v; want false, nil", ok, err)
		}
		if e.exists(t, "netlock:{a}") {
			t.Error("netlock:{a} exists after a refused TryLockCtx")
		}
		if mm.Tokens() != nil {
			t.Errorf("Tokens() not locked: got %v, want nil", mm.Tokens())
		}
		mustUnlock(t, b)
		if ok, err := mm.TryLockCtx(ctx); !ok || err != nil {
			t.Fatalf("TryLockCtx after b's Unlock: got %v, %v; want true, nil", ok, err)
		}
		mm.Unlock()
	})
}

// TestMultiOppositeOrders runs MultiMutexes given the same names in opposite
// orders, and NetMutexes of each name, against each other: no deadlock (the
// test ends), no two in a name's section at once, and each name's tokens
// strictly increase in the order of its acquisitions.
func TestMultiOppositeOrders(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const rounds = 15
		var sa, sb section
		var mu sync.Mutex
		tokens := map[string][]uint64{} // per name, in acquisition order
		record := func(name string, tok uint64) {
			mu.Lock()
			tokens[name] = append(tokens[name], tok)
			mu.Unlock()
		}
		var wg sync.WaitGroup
		for _, names := range [][]string{{"a", "b"}, {"b", "a"}, {"b", "a"}, {"a", "b"}} {
			mm := e.newMulti(t, names)
			wg.Go(func() {
				for range rounds {
					mustLockMulti(t, mm)
					for i, tok := range mm.Tokens() {
						record(names[i], tok)
					}
					sa.run(100 * time.Microsecond)
					sb.run(100 * time.Microsecond)
					mm.Unlock()
				}
			})
		}
		for _, name := range []string{"a", "b"} {
			m, s := e.newMutex(t, name), &sa
			if name == "b" {
				s = &sb
			}
			wg.Go(func() {
				for range rounds {
					mustLock(t, m)
					record(name, m.Token())
					s.run(100 * time.Microsecond)
					m.Unlock()
				}
			})
		}
		wg.Wait()
		sa.check(t, 5*rounds)
		sb.check(t, 5*rounds)
		for name, toks := range tokens {
			for i := 1; i < len(toks); i++ {
				if toks[i] <= toks[i-1] {
					t.Fatalf("name %q: token %d after %d: tokens must strictly increase", name, toks[i], toks[i-1])
				}
			}
		}
		for _, k := range []string{"netlock:{a}", "netlock:{b}"} {
			if e.exists(t, k) {
				t.Errorf("%s left behind", k)
			}
		}
	})
}

// TestMultiCancelLeavesNothing: a MultiMutex that gives up waiting for a
// name held by a NetMutex leaves none of its names held and no member in
// any waiters' queue.
func TestMultiCancelLeavesNothing(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		b := e.newMutex(t, "b")
		mustLock(t, b)
		mm := e.newMulti(t, []string{"c", "b", "a"})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- mm.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "the MultiMutex queued for b", func() bool { return len(e.queued(t, "b")) == 1 })
		cancel()
		err := <-done
		if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("LockCtx cancelled: got %v, want ErrNotObtained and context.Canceled", err)
		}
		for _, name := range []string{"a", "b", "c"} {
			if q := e.queued(t, name); len(q) != 0 {
				t.Errorf("queue of %q after the cancel: got %q, want empty", name, q)
			}
		}
		for _, k := range []string{"netlock:{a}", "netlock:{c}"} {
			if e.exists(t, k) {
				t.Errorf("%s held after the cancel", k)
			}
		}
		if ok, err := mm.TryLockCtx(context.Background()); ok || err != nil {
			t.Errorf("TryLockCtx with b held: got %v, %v; want false, nil", ok, err)
		}
		mustUnlock(t, b)

		// A deadline ends the wait the same way.
		mustLock(t, b)
		dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer dcancel()
		if err := mm.LockCtx(dctx); !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("LockCtx past its deadline: got %v, want ErrNotObtained and DeadlineExceeded", err)
		}
		if e.exists(t, "netlock:{a}") || e.exists(t, "netlock:{c}") || len(e.queued(t, "b")) != 0 {
			t.Error("a key or a queue member left behind after the deadline")
		}
		mustUnlock(t, b)
	})
}

// TestMultiWaitsByMessage: a MultiMutex waiting for a name is woken by that
// name's release (on miniredis, keys expire only with FastForward, and the
// expiry is a minute: only the message can let it in).
func TestMultiWaitsByMessage(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		a, b := e.newMutex(t, "a", WithExpiry(time.Minute)), e.newMutex(t, "b", WithExpiry(time.Minute))
		mustLock(t, a)
		mustLock(t, b)
		mm := e.newMulti(t, []string{"b", "a"}, WithExpiry(time.Minute))
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done <- mm.LockCtx(ctx)
		}()
		eventually(t, 5*time.Second, "the MultiMutex queued for a", func() bool { return len(e.queued(t, "a")) == 1 })
		mustUnlock(t, a)
		// Now it finds b held, and waits in b's queue instead.
		eventually(t, 5*time.Second, "the MultiMutex queued for b", func() bool { return len(e.queued(t, "b")) == 1 })
		if q := e.queued(t, "a"); len(q) != 0 {
			t.Errorf("queue of a while queued for b: got %q, want empty", q)
		}
		mustUnlock(t, b)
		if err := <-done; err != nil {
			t.Fatalf("LockCtx: %v", err)
		}
		if len(e.queued(t, "a"))+len(e.queued(t, "b")) != 0 {
			t.Error("a queue member left behind after the MultiMutex got in")
		}
		mm.Unlock()
	})
}

// TestMultiTokensIncrease: every acquisition of a name, by a MultiMutex or a
// NetMutex, gets a higher token than the one before.
func TestMultiTokensIncrease(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		a := e.newMutex(t, "a")
		mm := e.newMulti(t, []string{"b", "a", "zz"})
		var last uint64
		for range 3 {
			mustLock(t, a)
			tok := a.Token()
			mustUnlock(t, a)
			mustLockMulti(t, mm)
			toks := mm.Tokens()
			mm.Unlock()
			if len(toks) != 3 {
				t.Fatalf("Tokens(): got %v, want 3 tokens", toks)
			}
			if tok <= last || toks[1] <= tok {
				t.Fatalf("tokens of a: got %d then %d after %d, want increasing", tok, toks[1], last)
			}
			last = toks[1]
		}
		off := e.newMulti(t, []string{"x", "y"}, WithFencing(false))
		mustLockMulti(t, off)
		if got := off.Tokens(); len(got) != 2 || got[0] != 0 || got[1] != 0 {
			t.Errorf("Tokens() with fencing off: got %v, want [0 0]", got)
		}
		off.Unlock()
	})
}

// TestMultiLost: the hold of the set is lost when one name is lost, and
// when its deadline passes without an extend.
func TestMultiLost(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		ctx := context.Background()
		mm := e.newMulti(t, []string{"a", "b"})
		mustLockMulti(t, mm)
		lost := mm.Lost()
		if !isOpen(lost) {
			t.Fatal("Lost() closed while held")
		}
		e.do(t, "DEL", "netlock:{b}")
		if err := mm.ExtendCtx(ctx); !errors.Is(err, ErrLockLost) {
			t.Fatalf("ExtendCtx with b deleted: got %v, want ErrLockLost", err)
		}
		if isOpen(lost) {
			t.Error("Lost() open after ExtendCtx found b gone")
		}
		if err := mm.UnlockCtx(ctx); !errors.Is(err, ErrLockLost) {
			t.Errorf("UnlockCtx of a lost hold: got %v, want ErrLockLost", err)
		}
		if e.exists(t, "netlock:{a}") {
			t.Error("netlock:{a} left behind by the Unlock of a lost hold")
		}
	})
}

func TestMultiLostOnExpiry(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		mm := e.newMulti(t, []string{"a", "b"}, WithExpiry(200*time.Millisecond), WithAutoExtend(false),
			WithNodeTimeout(100*time.Millisecond))
		mustLockMulti(t, mm)
		select {
		case <-mm.Lost():
		case <-time.After(5 * time.Second):
			t.Fatal("Lost() not closed 5s after a 200ms hold without auto-extend")
		}
		if err := mm.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("UnlockCtx after expiry: got %v, want ErrLockLost", err)
		}
	})
}

// TestMultiAutoExtend: the watchdog extends every name of the set.
func TestMultiAutoExtend(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		mm := e.newMulti(t, []string{"a", "b"}, WithExpiry(300*time.Millisecond), WithNodeTimeout(100*time.Millisecond))
		mustLockMulti(t, mm)
		lost := mm.Lost()
		time.Sleep(time.Second) // three expiries: only extends keep the names
		if !isOpen(lost) {
			t.Fatal("Lost() closed with auto-extend on")
		}
		for _, name := range []string{"a", "b"} {
			if ok, _ := e.newMutex(t, name).TryLockCtx(context.Background()); ok {
				t.Errorf("NetMutex %q got in after three expiries of an extended MultiMutex", name)
			}
		}
		mm.Unlock()
	})
}

// TestMultiPassesTurnOn: a MultiMutex whose turn on a name comes while
// another of its names is held passes that turn on to the name's next
// waiter, who gets in by message (on miniredis, with a minute's expiry, no
// TTL runs out), and waits on the held name instead.
func TestMultiPassesTurnOn(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		opt := WithExpiry(time.Minute)
		ha := e.newMutex(t, "a", opt)
		mustLock(t, ha)
		mm := e.newMulti(t, []string{"a", "b"}, opt)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		multiDone := make(chan error, 1)
		go func() { multiDone <- mm.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "the MultiMutex queued for a", func() bool { return len(e.queued(t, "a")) == 1 })
		wa := e.newMutex(t, "a", opt)
		waDone := make(chan error, 1)
		go func() { waDone <- wa.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "the NetMutex queued for a behind the MultiMutex", func() bool { return len(e.queued(t, "a")) == 2 })
		hb := e.newMutex(t, "b", opt)
		mustLock(t, hb)

		mustUnlock(t, ha) // a's turn goes to the MultiMutex, which finds b held
		if err := <-waDone; err != nil {
			t.Fatalf("the NetMutex behind the MultiMutex: LockCtx: %v", err)
		}
		eventually(t, 5*time.Second, "the MultiMutex queued for b", func() bool { return len(e.queued(t, "b")) == 1 })
		mustUnlock(t, hb)
		mustUnlock(t, wa)
		if err := <-multiDone; err != nil {
			t.Fatalf("MultiMutex LockCtx: %v", err)
		}
		mm.Unlock()
	})
}

// TestMultiLeavePassesTurnOn: the leave of a MultiMutex waiter queued
// nowhere (a release popped it, giving it its turn, as its context ended)
// passes the turn of every free name on: a NetMutex waiting for a name whose
// key vanished without a release gets in by message, not at the holder's
// TTL (a minute here).
func TestMultiLeavePassesTurnOn(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		opt := WithExpiry(time.Minute)
		h := e.newMutex(t, "a", opt)
		mustLock(t, h)
		w := e.newMutex(t, "a", opt)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- w.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "the NetMutex queued for a", func() bool { return len(e.queued(t, "a")) == 1 })
		e.do(t, "DEL", "netlock:{a}") // the holder's key gone, no release: nobody is told

		mm := e.newMulti(t, []string{"b", "a"}, opt)
		m := mm.m.(oneSlot).engine
		s, keys, args := m.kind.leaveCall(m.waiterID) // a member queued nowhere
		vals, err := m.nodes[0].Eval(ctx, s, keys, args)
		if err != nil || len(vals) != 2 || vals[0] != 0 || vals[1] != 1 {
			t.Fatalf("multi_leave: got %v, %v; want [0 1] (queued nowhere, one client told)", vals, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("NetMutex LockCtx after the turn was passed on: %v", err)
		}
		mustUnlock(t, w)
		h.UnlockCtx(context.Background()) // its key is gone: ErrLockLost
	})
}
