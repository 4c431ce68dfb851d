package netlock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// section is a critical section that notices overlap: inside counts the
// goroutines in it at once, and count is updated without synchronisation of
// its own, as code guarded by a mutex would be.
type section struct {
	inside   atomic.Int32
	overlaps atomic.Int32
	count    int
}

func (s *section) run(pause time.Duration) {
	if s.inside.Add(1) != 1 {
		s.overlaps.Add(1)
	}
	c := s.count
	time.Sleep(pause)
	s.count = c + 1
	s.inside.Add(-1)
}

func (s *section) check(t *testing.T, want int) {
	t.Helper()
	if n := s.overlaps.Load(); n != 0 {
		t.Errorf("overlapping critical sections: got %d, want 0", n)
	}
	if s.count != want {
		t.Errorf("count: got %d, want %d", s.count, want)
	}
}

func TestSharedLockerExcludes(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		var l sync.Locker = e.newMutex(t, "shared")
		const goroutines, rounds = 100, 3
		var s section
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for range rounds {
					l.Lock()
					s.run(100 * time.Microsecond)
					l.Unlock()
				}
			})
		}
		wg.Wait()
		s.check(t, goroutines*rounds)
		if e.exists(t, "netlock:{shared}") {
			t.Error("lock key left behind after the last Unlock")
		}
	})
}

func TestSeparateClientsExclude(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const clients, rounds = 8, 25
		var s section
		var wg sync.WaitGroup
		tokens := make([][]uint64, clients)
		for i := range clients {
			m := e.newMutex(t, "separate") // its own client, as another process
			wg.Go(func() {
				for range rounds {
					m.Lock()
					tokens[i] = append(tokens[i], m.Token())
					s.run(100 * time.Microsecond)
					m.Unlock()
				}
			})
		}
		wg.Wait()
		s.check(t, clients*rounds)
		seen := map[uint64]bool{}
		for _, ts := range tokens {
			for j, tok := range ts {
				if seen[tok] {
					t.Errorf("token %d granted twice", tok)
				}
				seen[tok] = true
				if j > 0 && tok <= ts[j-1] {
					t.Errorf("tokens of one client not increasing: %d after %d", tok, ts[j-1])
				}
			}
		}
	})
}

func TestTryLock(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		a := e.newMutex(t, "try")
		b := e.newMutex(t, "try")
		if !a.TryLock() {
			t.Fatal("a.TryLock on a free lock: got false, want true")
		}
		if a.TryLock() {
			t.Error("a.TryLock while a holds it: got true, want false")
		}
		if b.TryLock() {
			t.Error("b.TryLock while a holds it: got true, want false")
		}
		a.Unlock()
		if !b.TryLock() {
			t.Error("b.TryLock after a.Unlock: got false, want true")
		}
		b.Unlock()
	})
}

func TestUnlockOfUnlockedPanics(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		m := e.newMutex(t, "unlocked")
		err := recoverErr(m.Unlock)
		if !errors.Is(err, ErrNotHeld) {
			t.Fatalf("panic value: got %v, want an error matching ErrNotHeld", err)
		}
		if want := "netlock: unlock of unlocked mutex"; err.Error() != want {
			t.Errorf("panic message: got %q, want %q", err.Error(), want)
		}
		m.Lock()
		m.Unlock()
		if err := recoverErr(m.Unlock); !errors.Is(err, ErrNotHeld) {
			t.Errorf("second Unlock: got %v, want a panic matching ErrNotHeld", err)
		}
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("UnlockCtx unlocked: got %v, want ErrNotHeld", err)
		}
	})
}

// recoverErr runs fn and returns the error it panicked with (nil if it did
// not panic).
func recoverErr(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			var ok bool
			if err, ok = r.(error); !ok {
				err = errors.New("panic with a non-error value")
			}
		}
	}()
	fn()
	return nil
}

func TestRedisDown(t *testing.T) {
	// A port nobody listens on: the connection is refused at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", addr)
	}}
	t.Cleanup(func() { pool.Close() })
	m, err := New("down", []Backend{NewRedigo(pool)}, WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var lerr error
	within(t, 5*time.Second, "Lock on a refused server", func() { lerr = recoverErr(m.Lock) })
	if !errors.Is(lerr, ErrQuorum) || !strings.Contains(lerr.Error(), "node 0") {
		t.Errorf("Lock panic: got %v, want an error matching ErrQuorum naming node 0", lerr)
	}
	within(t, 5*time.Second, "TryLockCtx on a refused server", func() {
		ok, err := m.TryLockCtx(context.Background())
		if ok || !errors.Is(err, ErrQuorum) {
			t.Errorf("TryLockCtx: got (%v, %v), want (false, ErrQuorum)", ok, err)
		}
	})
	// The failed attempts left m unlocked in this process.
	if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("UnlockCtx after failed Lock: got %v, want ErrNotHeld", err)
	}
}

func TestRedisStalled(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		m := e.newMutex(t, "stalled", WithNodeTimeout(200*time.Millisecond))
		e.server.Pause()
		defer e.server.Resume()
		var err error
		within(t, 5*time.Second, "LockCtx on a stopped server", func() { err = m.LockCtx(context.Background()) })
		if !errors.Is(err, ErrQuorum) || !strings.Contains(err.Error(), "node 0") {
			t.Errorf("LockCtx: got %v, want an error matching ErrQuorum naming node 0", err)
		}
		e.server.Resume()
		mustLock(t, m)
		mustUnlock(t, m)
	})
}

func TestZeroValue(t *testing.T) {
	var m NetMutex
	if err := m.LockCtx(context.Background()); err == nil || !strings.Contains(err.Error(), "New") {
		t.Errorf("LockCtx on the zero value: got %v, want an error saying to use New", err)
	}
	if err := recoverErr(m.Lock); err == nil {
		t.Error("Lock on the zero value did not panic")
	}
	if tok := m.Token(); tok != 0 {
		t.Errorf("Token on the zero value: got %d, want 0", tok)
	}
}
