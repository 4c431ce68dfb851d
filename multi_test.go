package netlock

import (
	"context"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// newMulti returns a MultiMutex of names on a backend of its own.
func (e *env) newMulti(t testing.TB, names []string, opts ...Option) *MultiMutex {
	t.Helper()
	mm, err := NewMulti(names, []Backend{e.backend(t)}, opts...)
	if err != nil {
		t.Fatalf("NewMulti(%q): %v", names, err)
	}
	return mm
}

// mustLockMulti locks mm with a bound, failing the test rather than hanging.
func mustLockMulti(t testing.TB, mm *MultiMutex) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mm.LockCtx(ctx); err != nil {
		t.Fatalf("LockCtx(%q): %v", mm.Names(), err)
	}
}

// queued returns the members of name's waiters' queue.
func (e *env) queued(t testing.TB, name string) []string {
	t.Helper()
	members, err := redis.Strings(e.do(t, "ZRANGE", "netlock:{"+name+"}:waiters", 0, -1), nil)
	if err != nil {
		t.Fatalf("ZRANGE: %v", err)
	}
	return members
}

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
