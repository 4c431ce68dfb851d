package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
)

// TestRWQuorumProgress is the reproduction of a liveness failure of
// NetRWMutex on a quorum, found by TestChaosRW, without faults, proxies or
// checker: eight clients, each with one writer (20ms between its holds) and
// two readers (1ms read sections), on one redis-server and on five. On one
// server the lock passes a few hundred times a second; on five, a handful:
// the lock is free on every server most of the time while every client
// waits. Each server's queues order the waiters by that server's arrival
// times, which differ from server to server; rw_acquire.lua grants a free
// server only to the waiter at the head of its queues, and the heads differ,
// so most rounds are granted by a minority of the servers, fail, and release
// what they got (waking every waiter for another round); and a grant takes
// the waiter off that server's queue (rw_acquire.lua, "if arrival then
// ZREM"), so that it is behind the others there next time. The counts of
// rw_acquire replies (status 1: a server granted) show it.
func TestRWQuorumProgress(t *testing.T) {
	for _, n := range []int{1, 5} {
		t.Run(fmt.Sprintf("%d servers", n), func(t *testing.T) {
			servers := startServers(t, n)
			var mu sync.Mutex
			calls := map[string]int{}
			rws := make([]*netlock.NetRWMutex, chaosClients)
			for i := range rws {
				b := make([]netlock.Backend, n)
				for k, s := range servers {
					b[k] = &countingBackend{Backend: newBackend(t, chaosClient(t, i), s.Addr()), mu: &mu, calls: calls}
				}
				rw, err := netlock.NewRW("progress", b, netlock.WithExpiry(time.Second), netlock.WithLogger(slog.New(slog.DiscardHandler)))
				if err != nil {
					t.Fatal(err)
				}
				rws[i] = rw
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var writes, reads atomic.Int64
			var wg sync.WaitGroup
			for _, rw := range rws {
				wg.Go(func() {
					for ctx.Err() == nil {
						time.Sleep(20 * time.Millisecond)
						if rw.LockCtx(ctx) != nil {
							return
						}
						writes.Add(1)
						rw.Unlock()
					}
				})
				for range 2 {
					wg.Go(func() {
						for ctx.Err() == nil {
							if rw.RLockCtx(ctx) != nil {
								return
							}
							reads.Add(1)
							time.Sleep(time.Millisecond)
							rw.RUnlock()
						}
					})
				}
			}
			// Halfway: who is at the head of each server's queues, and
			// whether anyone holds.
			time.Sleep(2500 * time.Millisecond)
			w := lockKey("progress") + ":rw"
			for k, s := range servers {
				holder, _ := s.Do("GET", w)
				wq, _ := s.Do("ZRANGE", w+":writers", "0", "0")
				rq, _ := s.Do("ZRANGE", w+":readers", "0", "0")
				t.Logf("server %d at 2.5s: writer key %q, head of the writers' queue %q, of the readers' %q", k, holder, wq, rq)
			}
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%d servers, 5s: %d write locks, %d read locks; calls (script, mode, status): %v", n, writes.Load(), reads.Load(), calls)
			if writes.Load() < 100 {
				t.Errorf("%d servers: only %d write locks and %d read locks in 5s (one server: several hundred of each)", n, writes.Load(), reads.Load())
			}
		})
	}
}

// countingBackend counts the scripts a Backend runs, and rw_acquire's
// replies by mode and status.
type countingBackend struct {
	netlock.Backend
	mu    *sync.Mutex
	calls map[string]int
}

func (b *countingBackend) Eval(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	vals, err := b.Backend.Eval(ctx, s, keys, args)
	k := s.Name()
	if k == "rw_acquire" && len(args) == 1 {
		k += " " + strings.SplitN(args[0], ":", 2)[0]
		if err == nil && len(vals) > 0 {
			k += fmt.Sprint(" ", vals[0])
		} else {
			k += " error"
		}
	}
	b.mu.Lock()
	b.calls[k]++
	b.mu.Unlock()
	return vals, err
}

func (b *countingBackend) Hub() *netlock.Hub {
	if s, ok := b.Backend.(netlock.Subscriber); ok {
		return s.Hub()
	}
	return nil
}

func (b *countingBackend) Final(err error) bool {
	f, ok := b.Backend.(netlock.ErrorClassifier)
	return ok && f.Final(err)
}
