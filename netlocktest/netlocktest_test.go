package netlocktest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/netlocktest"
)

// The expiry of the locks below: long, so that a test that waited for it
// in real time would time out (see timeout).
const expiry = time.Minute

// timeout bounds each wait of a test, in real time: well under expiry.
const timeout = 10 * time.Second

// clients are the Backends a Server makes, each tested alike.
var clients = []struct {
	name    string
	backend func(*netlocktest.Server) netlock.Backend
}{
	{"redigo", (*netlocktest.Server).Redigo},
	{"rueidis", (*netlocktest.Server).Rueidis},
	{"goredis", (*netlocktest.Server).GoRedis},
}

func newMutex(t *testing.T, name string, b netlock.Backend, opts ...netlock.Option) *netlock.NetMutex {
	t.Helper()
	m, err := netlock.New(name, []netlock.Backend{b}, append([]netlock.Option{netlock.WithExpiry(expiry)}, opts...)...)
	if err != nil {
		t.Fatalf("netlock.New: %v", err)
	}
	return m
}

// eventually polls cond until it holds, or fails the test after timeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("after %v: %s: not yet", timeout, what)
		}
	}
}

// queued returns how many waiters the sorted set key holds.
func queued(s *netlocktest.Server, key string) int {
	members, err := s.Miniredis().ZMembers(key)
	if err != nil {
		return 0
	}
	return len(members)
}

// closed reports whether c is closed now.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A holder that dies without unlocking keeps the lock until its key
// expires; FastForward past its expiry lets the waiter in at once, in real
// time, and closes the holder's Lost. The waiter waits by message, with a
// place in the queue, on every client.
func TestDeadHolderWaiterTakesOver(t *testing.T) {
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			s := netlocktest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			// The holder stands for a process that died: nothing extends its key.
			holder := newMutex(t, "job", c.backend(s), netlock.WithAutoExtend(false))
			if err := holder.LockCtx(ctx); err != nil {
				t.Fatalf("holder LockCtx: %v", err)
			}
			waiter := newMutex(t, "job", c.backend(s))
			start := time.Now()
			got := make(chan error, 1)
			go func() { got <- waiter.LockCtx(ctx) }()
			eventually(t, "the waiter is queued", func() bool { return queued(s, "netlock:{job}:waiters") == 1 })

			s.FastForward(expiry - time.Second)
			select {
			case err := <-got:
				t.Fatalf("waiter LockCtx returned %v before the holder's key expired", err)
			default:
			}
			if closed(holder.Lost()) {
				t.Fatal("holder's Lost closed before its deadline")
			}

			s.FastForward(2 * time.Second)
			if !closed(holder.Lost()) {
				t.Error("holder's Lost not closed once its deadline passed")
			}
			if err := <-got; err != nil {
				t.Fatalf("waiter LockCtx: got %v, want nil", err)
			}
			if took := time.Since(start); took > timeout/2 {
				t.Errorf("waiter took %v in real time, want well under the expiry (%v)", took, expiry)
			}
			if err := waiter.UnlockCtx(ctx); err != nil {
				t.Errorf("waiter UnlockCtx: %v", err)
			}
			if err := holder.UnlockCtx(ctx); !errors.Is(err, netlock.ErrLockLost) {
				t.Errorf("holder UnlockCtx: got %v, want ErrLockLost", err)
			}
		})
	}
}

// A hold whose process lives stays held however far time moves: the
// watchdog extends it at each step of FastForward.
func TestWatchdogKeepsHold(t *testing.T) {
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			s := netlocktest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			m := newMutex(t, "job", c.backend(s))
			if err := m.LockCtx(ctx); err != nil {
				t.Fatalf("LockCtx: %v", err)
			}
			for range 10 {
				s.FastForward(expiry * 5 / 6)
			}
			s.FastForward(10 * expiry) // in one call too
			if closed(m.Lost()) {
				t.Fatal("Lost closed while the watchdog could extend")
			}
			if ttl := s.Miniredis().TTL("netlock:{job}"); ttl <= 0 {
				t.Errorf("lock key's TTL: got %v, want > 0", ttl)
			}
			other := newMutex(t, "job", c.backend(s))
			if ok, err := other.TryLockCtx(ctx); ok || err != nil {
				t.Errorf("another client's TryLockCtx: got %v, %v, want false, nil", ok, err)
			}
			if err := m.UnlockCtx(ctx); err != nil {
				t.Errorf("UnlockCtx: %v", err)
			}
		})
	}
}

// A hold whose watchdog cannot extend is lost: at once when the extend
// finds its key gone, at its deadline when the server does not answer.
func TestLostWhenExtendFails(t *testing.T) {
	for _, c := range clients {
		for _, fault := range []struct {
			name  string
			apply func(*netlocktest.Server)
		}{
			{"key deleted", func(s *netlocktest.Server) { s.Miniredis().Del("netlock:{job}") }},
			{"server closed", func(s *netlocktest.Server) { s.Miniredis().Close() }},
		} {
			t.Run(c.name+"/"+fault.name, func(t *testing.T) {
				s := netlocktest.New(t)
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				m := newMutex(t, "job", c.backend(s))
				if err := m.LockCtx(ctx); err != nil {
					t.Fatalf("LockCtx: %v", err)
				}
				fault.apply(s)
				s.FastForward(expiry / 6)
				if closed(m.Lost()) {
					t.Fatal("Lost closed before the watchdog's first extend")
				}
				s.FastForward(expiry)
				if !closed(m.Lost()) {
					t.Fatal("Lost not closed after an expiry without an extend")
				}
				if err := m.UnlockCtx(ctx); !errors.Is(err, netlock.ErrLockLost) {
					t.Errorf("UnlockCtx: got %v, want ErrLockLost", err)
				}
			})
		}
	}
}

// A NetRWMutex's writer that dies lets a reader in once its key expires.
func TestRWDeadWriter(t *testing.T) {
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			s := netlocktest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			writer, err := netlock.NewRW("doc", []netlock.Backend{c.backend(s)}, netlock.WithExpiry(expiry), netlock.WithAutoExtend(false))
			if err != nil {
				t.Fatal(err)
			}
			if err := writer.LockCtx(ctx); err != nil {
				t.Fatalf("writer LockCtx: %v", err)
			}
			reader, err := netlock.NewRW("doc", []netlock.Backend{c.backend(s)}, netlock.WithExpiry(expiry))
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() { got <- reader.RLockCtx(ctx) }()
			eventually(t, "the reader is queued", func() bool { return queued(s, "netlock:{doc}:rw:readers") == 1 })

			s.FastForward(expiry + time.Second)
			if !closed(writer.Lost()) {
				t.Error("writer's Lost not closed once its deadline passed")
			}
			if err := <-got; err != nil {
				t.Fatalf("reader RLockCtx: got %v, want nil", err)
			}
			s.FastForward(3 * expiry) // the reader's lease is extended meanwhile
			if closed(reader.RLost()) {
				t.Error("reader's RLost closed while its watchdog could extend")
			}
			if err := reader.RUnlockCtx(ctx); err != nil {
				t.Errorf("reader RUnlockCtx: %v", err)
			}
			if err := writer.UnlockCtx(ctx); !errors.Is(err, netlock.ErrLockLost) {
				t.Errorf("writer UnlockCtx: got %v, want ErrLockLost", err)
			}
		})
	}
}

// A Semaphore's holder that dies frees its permits once its lease expires.
func TestSemaphoreDeadHolder(t *testing.T) {
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			s := netlocktest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			holder, err := netlock.NewSemaphore("pool", 2, []netlock.Backend{c.backend(s)}, netlock.WithExpiry(expiry), netlock.WithAutoExtend(false))
			if err != nil {
				t.Fatal(err)
			}
			if err := holder.Acquire(ctx, 2); err != nil {
				t.Fatalf("holder Acquire: %v", err)
			}
			waiter, err := netlock.NewSemaphore("pool", 2, []netlock.Backend{c.backend(s)}, netlock.WithExpiry(expiry))
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() { got <- waiter.Acquire(ctx, 1) }()
			eventually(t, "the waiter is queued", func() bool { return queued(s, "netlock:{pool}:sem:queue") == 1 })

			s.FastForward(expiry + time.Second)
			if !closed(holder.Lost()) {
				t.Error("holder's Lost not closed once its deadline passed")
			}
			if err := <-got; err != nil {
				t.Fatalf("waiter Acquire: got %v, want nil", err)
			}
			s.FastForward(3 * expiry)
			if closed(waiter.Lost()) {
				t.Error("waiter's Lost closed while its watchdog could extend")
			}
			if err := waiter.ReleaseCtx(ctx, 1); err != nil {
				t.Errorf("waiter ReleaseCtx: %v", err)
			}
			if err := holder.ReleaseCtx(ctx, 2); !errors.Is(err, netlock.ErrLockLost) {
				t.Errorf("holder ReleaseCtx: got %v, want ErrLockLost", err)
			}
		})
	}
}

// Servers keep their own time: moving one moves nothing of another's, so
// tests using them may run in parallel.
func TestServersKeepTheirTime(t *testing.T) {
	t.Parallel()
	moved, still := netlocktest.New(t), netlocktest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	m := newMutex(t, "job", still.Redigo(), netlock.WithAutoExtend(false))
	if err := m.LockCtx(ctx); err != nil {
		t.Fatalf("LockCtx: %v", err)
	}
	moved.FastForward(10 * expiry)
	if closed(m.Lost()) {
		t.Error("Lost closed by another server's FastForward")
	}
	still.FastForward(expiry)
	if !closed(m.Lost()) {
		t.Error("Lost not closed by its own server's FastForward")
	}
	if err := m.UnlockCtx(ctx); !errors.Is(err, netlock.ErrLockLost) {
		t.Errorf("UnlockCtx: got %v, want ErrLockLost", err)
	}
}
