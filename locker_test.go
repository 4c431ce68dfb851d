package netlock

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	time.Sleep(pause) // the section's length: a lost update shows if another enters
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
