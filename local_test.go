package netlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// handOffRun locks m, queues waiters goroutines on it one after another (each
// records its turn, then unlocks), and unlocks m once they all wait. It
// returns the order in which the waiters ran and the token each saw.
func handOffRun(t *testing.T, m *NetMutex, waiters int) (order []int, tokens []uint64) {
	t.Helper()
	mustLock(t, m)
	first := m.Token()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			if err := m.LockCtx(context.Background()); err != nil {
				t.Errorf("waiter %d: LockCtx: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			tokens = append(tokens, m.Token())
			mu.Unlock()
			if err := m.UnlockCtx(context.Background()); err != nil {
				t.Errorf("waiter %d: UnlockCtx: %v", i, err)
			}
		})
		// Queued in this order: wait until it is.
		eventually(t, 5*time.Second, "waiter queued", func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return len(m.waiters) == i+1
		})
	}
	mustUnlock(t, m)
	wg.Wait()
	return order, append([]uint64{first}, tokens...)
}

// Goroutines sharing a NetMutex get the hold handed over, in order of
// arrival, without a round trip, up to the bound; then Unlock releases in
// Redis and the next waiter acquires.
func TestLocalHandoff(t *testing.T) {
	tests := []struct {
		name               string
		opts               []Option
		waiters            int
		acquires, releases int
		distinctTokens     int
	}{
		// One acquire: six holds (the first and five hand-offs) in a row.
		{"default bound", nil, 5, 1, 1, 1},
		// Two hand-offs, a release, a fresh acquire, two more hand-offs.
		{"bound 2", []Option{WithLocalHandoffs(2)}, 5, 2, 2, 2},
		{"off", []Option{WithLocalHandoffs(0)}, 5, 6, 6, 6},
		// Without the watchdog a handed hold would have less time left
		// than a caller of Lock expects: every Unlock releases.
		{"no auto-extend", []Option{WithAutoExtend(false)}, 3, 4, 4, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
				cb := counting(e.backend(t))
				m, err := New("handoff", []Backend{cb}, tt.opts...)
				if err != nil {
					t.Fatal(err)
				}
				order, tokens := handOffRun(t, m, tt.waiters)
				for i, w := range order {
					if w != i {
						t.Fatalf("waiters ran in order %v, want arrival order", order)
					}
				}
				if got := cb.count("acquire"); got != tt.acquires {
					t.Errorf("acquire calls: got %d, want %d", got, tt.acquires)
				}
				if got := cb.count("release"); got != tt.releases {
					t.Errorf("release calls: got %d, want %d", got, tt.releases)
				}
				distinct := 1
				for i := 1; i < len(tokens); i++ {
					switch {
					case tokens[i] < tokens[i-1]:
						t.Errorf("tokens went down: %v", tokens)
					case tokens[i] > tokens[i-1]:
						distinct++
					}
				}
				if distinct != tt.distinctTokens {
					t.Errorf("tokens %v: got %d distinct, want %d", tokens, distinct, tt.distinctTokens)
				}
				if e.exists(t, "netlock:{handoff}") {
					t.Error("lock key left after the last Unlock")
				}
			})
		})
	}
}

// A local waiter that gives up leaves the queue; the hold goes to the next.
// A lost hold is never handed over: Unlock reports ErrLockLost and the next
// waiter acquires afresh.
func TestLocalHandoffCancelAndLoss(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		cb := counting(e.backend(t))
		m, err := New("cancel", []Backend{cb})
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, m)
		ctx, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan error, 1)
		go func() { gaveUp <- m.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "waiter queued", func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return len(m.waiters) == 1
		})
		got := make(chan uint64, 1)
		go func() {
			if err := m.LockCtx(context.Background()); err != nil {
				t.Errorf("LockCtx: %v", err)
			}
			got <- m.Token()
		}()
		eventually(t, 5*time.Second, "second waiter queued", func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return len(m.waiters) == 2
		})
		cancel()
		if err := <-gaveUp; !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: got %v, want ErrNotObtained and context.Canceled", err)
		}
		first := m.Token()
		mustUnlock(t, m)
		if tok := <-got; tok != first {
			t.Errorf("handed-over token: got %d, want %d", tok, first)
		}
		if n := cb.count("acquire"); n != 1 {
			t.Errorf("acquire calls: got %d, want 1", n)
		}

		// Lose the hold: the key is deleted behind our back and the
		// watchdog's next extend finds it gone.
		waiting := make(chan error, 1)
		go func() {
			err := m.LockCtx(context.Background())
			if err == nil {
				err = m.UnlockCtx(context.Background())
			}
			waiting <- err
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return len(m.waiters) == 1
		})
		e.do(t, "DEL", "netlock:{cancel}")
		if err := m.ExtendCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Fatalf("ExtendCtx after DEL: got %v, want ErrLockLost", err)
		}
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("UnlockCtx of a lost hold: got %v, want ErrLockLost", err)
		}
		if err := <-waiting; err != nil {
			t.Errorf("waiter after the loss: %v", err)
		}
		if n := cb.count("acquire"); n != 2 {
			t.Errorf("acquire calls: got %d, want 2 (the waiter acquires afresh)", n)
		}
	})
}

// Many goroutines sharing one NetMutex exclude each other, with hand-offs
// and releases mixed.
func TestLocalHandoffExcludes(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		m := e.newMutex(t, "many", WithLocalHandoffs(3))
		other := e.newMutex(t, "many")
		var inside, overlaps, n int
		var mu sync.Mutex
		section := func() {
			mu.Lock()
			inside++
			if inside > 1 {
				overlaps++
			}
			n++
			mu.Unlock()
			time.Sleep(50 * time.Microsecond) // the section's length
			mu.Lock()
			inside--
			mu.Unlock()
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20 {
					lockSection(t, m, section)
				}
			})
		}
		wg.Go(func() { // another client, which must get turns
			for range 20 {
				lockSection(t, other, section)
			}
		})
		wg.Wait()
		if overlaps != 0 || n != 180 {
			t.Errorf("%d sections, %d overlapping; want 180, 0", n, overlaps)
		}
	})
}

// lockSection runs section under m; it may be called from any goroutine.
func lockSection(t *testing.T, m *NetMutex, section func()) {
	if err := m.LockCtx(context.Background()); err != nil {
		t.Errorf("LockCtx: %v", err)
		return
	}
	section()
	if err := m.UnlockCtx(context.Background()); err != nil {
		t.Errorf("UnlockCtx: %v", err)
	}
}
