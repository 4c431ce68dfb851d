package netlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// quorumMulti returns a MultiMutex over servers, with clients of its own.
func quorumMulti(t *testing.T, client string, servers []*redistest.Server, names []string, opts ...Option) *MultiMutex {
	t.Helper()
	backends := make([]Backend, len(servers))
	for i, s := range servers {
		backends[i] = newBackend(t, client, s.Addr())
	}
	mm, err := NewMulti(names, backends, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mm
}

// TestMultiQuorumOneDown: over three servers, one of them killed,
// MultiMutexes given their names in opposite orders and a NetMutex of one
// name exclude each other, tokens increase, and nothing is left held.
func TestMultiQuorumOneDown(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			servers := startServers(t, 3)
			opts := []Option{WithNodeTimeout(150 * time.Millisecond)}
			const rounds = 6
			var sa, sb section
			var mu sync.Mutex
			var tokens []uint64 // of name a, in acquisition order
			var wg sync.WaitGroup
			mms := []*MultiMutex{quorumMulti(t, client, servers, []string{"a", "b"}, opts...), quorumMulti(t, client, servers, []string{"b", "a"}, opts...)}
			m := quorumMutex(t, client, servers, "a", opts...)
			servers[2].Kill() // after the clients are made: rueidis's NewClient needs its server
			for _, mm := range mms {
				wg.Go(func() {
					for range rounds {
						mustLockMulti(t, mm)
						mu.Lock()
						tokens = append(tokens, mm.Tokens()[0])
						mu.Unlock()
						sa.run(100 * time.Microsecond)
						sb.run(100 * time.Microsecond)
						if err := mm.ExtendCtx(context.Background()); err != nil {
							t.Errorf("ExtendCtx with one node down: %v", err)
						}
						mm.Unlock()
					}
				})
			}
			wg.Go(func() {
				for range rounds {
					mustLock(t, m)
					mu.Lock()
					tokens = append(tokens, m.Token())
					mu.Unlock()
					sa.run(100 * time.Microsecond)
					m.Unlock()
				}
			})
			wg.Wait()
			sa.check(t, 3*rounds)
			sb.check(t, 2*rounds)
			for i := 1; i < len(tokens); i++ {
				if tokens[i] <= tokens[i-1] {
					t.Fatalf("token of a %d after %d: must strictly increase", tokens[i], tokens[i-1])
				}
			}
			for _, name := range []string{"a", "b"} {
				if h := holders(t, servers[:2], name); h != 0 {
					t.Errorf("lock key of %q left on %d servers", name, h)
				}
			}
		})
	}
}

// TestMultiQuorumCancel: a MultiMutex over a quorum that gives up waiting
// leaves no name held and no queue member on any server.
func TestMultiQuorumCancel(t *testing.T) {
	servers := startServers(t, 3)
	b := quorumMutex(t, "redigo", servers, "b")
	mustLock(t, b)
	mm := quorumMulti(t, "rueidis", servers, []string{"a", "b", "c"})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := mm.LockCtx(ctx); !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockCtx: got %v, want ErrNotObtained and DeadlineExceeded", err)
	}
	for _, name := range []string{"a", "c"} {
		if h := holders(t, servers, name); h != 0 {
			t.Errorf("lock key of %q left on %d servers", name, h)
		}
	}
	for i, s := range servers {
		for _, name := range []string{"a", "b", "c"} {
			if n, err := s.Do("ZCARD", fmt.Sprintf("netlock:{%s}:waiters", name)); err != nil || n != "0" {
				t.Errorf("server %d: queue of %q: got %s members (%v), want 0", i, name, n, err)
			}
		}
	}
	mustUnlock(t, b)
	mustLockMulti(t, mm)
	mm.Unlock()
}
