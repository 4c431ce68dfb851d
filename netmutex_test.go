package netlock

import (
	"sync"
	"testing"
	"time"
)

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
