package netlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// TestSemBadInputServer: keys of another type (each of the five), scripts
// flushed, a stalled server: a clear error, nothing changed, nothing
// stranded.
func TestSemBadInputServer(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			s := redistest.Start(t)
			newSem := func(name string, size int64, opts ...Option) *Semaphore {
				sem, err := NewSemaphore(name, size, []Backend{newBackend(t, client, s.Addr())}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				return sem
			}
			for _, k := range semKeysOf("wrong") {
				t.Run("WRONGTYPE/"+k, func(t *testing.T) {
					sdo(t, s, "FLUSHALL")
					// Full, so that the attempt is refused and takes its
					// place: every key is then read or written.
					full := newSem("wrong", 1)
					full.TryAcquire(1)
					sdo(t, s, "SET", k, "kept")
					sem := newSem("wrong", 1)
					var err error
					redistest.Within(t, 5*time.Second, "Acquire", func() { err = sem.Acquire(context.Background(), 1) })
					wantNodeErr(t, "Acquire with a string at "+k, err, "WRONGTYPE")
					if v := sdo(t, s, "GET", k); v != "kept" {
						t.Errorf("the string after the failed Acquire: got %q, want it untouched", v)
					}
					if sem.Held() != 0 {
						t.Errorf("Held after a failed Acquire: %d", sem.Held())
					}
				})
			}
			t.Run("SCRIPT FLUSH", func(t *testing.T) {
				sdo(t, s, "FLUSHALL")
				sem := newSem("flushed", 2)
				mustAcquire(t, sem, 1)
				sdo(t, s, "SCRIPT", "FLUSH")
				mustAcquire(t, sem, 1)
				sdo(t, s, "SCRIPT", "FLUSH")
				if err := sem.ReleaseCtx(context.Background(), 2); err != nil {
					t.Fatal(err)
				}
				if v := sdo(t, s, "EXISTS", keyspace.Sem(DefaultPrefix, "flushed").Leases); v != "0" {
					t.Fatal("the lease left after releasing every permit")
				}
			})
			t.Run("stalled", func(t *testing.T) {
				sdo(t, s, "FLUSHALL")
				sem := newSem("stalled", 2, WithNodeTimeout(200*time.Millisecond), WithOutageWindow(hostileOutage))
				mustAcquire(t, sem, 1)
				s.Pause()
				var aerr, rerr, terr error
				redistest.Within(t, 5*time.Second, "Acquire", func() { aerr = sem.Acquire(context.Background(), 1) })
				redistest.Within(t, 5*time.Second, "TryAcquireCtx", func() { _, terr = sem.TryAcquireCtx(context.Background(), 1) })
				redistest.Within(t, 5*time.Second, "ReleaseCtx", func() { rerr = sem.ReleaseCtx(context.Background(), 1) })
				s.Resume()
				wantNodeErr(t, "Acquire on a stalled server", aerr, "")
				wantNodeErr(t, "TryAcquireCtx on a stalled server", terr, "")
				wantNodeErr(t, "ReleaseCtx on a stalled server", rerr, "")
				if sem.Held() != 0 {
					t.Fatalf("Held: %d, want 0 (the release is given back here whatever Redis did)", sem.Held())
				}
				// The calls the stalled server ran when it came back (a
				// grant nobody took, the release) are set right in the
				// background: nothing is left out.
				eventually(t, 5*time.Second, "the permits back in Redis", func() bool {
					return sdo(t, s, "EXISTS", keyspace.Sem(DefaultPrefix, "stalled").Leases) == "0"
				})
				mustAcquire(t, sem, 2)
				sem.Release(2)
			})
		})
	}
}

// When Redis cannot be asked, Acquire (once the outage window has passed),
// TryAcquireCtx and TryAcquire's panic give an error matching ErrQuorum,
// as Acquire's doc (and NetMutex's LockCtx and TryLockCtx) promise, not
// the node's error as it was ("netlock: node 0: read tcp …: connection
// reset by peer").
func TestSemaphoreServerDownErrQuorum(t *testing.T) {
	// go-redis is left out: its pool dials on a goroutine that outlives a
	// refused server for a while (goleak).
	for _, client := range []string{"redigo", "rueidis"} {
		t.Run(client, func(t *testing.T) {
			// rueidis dials when its client is made: the server is there
			// then, and gone before the permits are asked for.
			s := redistest.Start(t)
			sem, err := NewSemaphore("down", 2, []Backend{newBackend(t, client, s.Addr())},
				WithNodeTimeout(200*time.Millisecond), WithOutageWindow(hostileOutage))
			if err != nil {
				t.Fatal(err)
			}
			s.Kill()
			redistest.Within(t, 5*time.Second, "Acquire", func() {
				err = sem.Acquire(context.Background(), 1)
			})
			wantNodeErr(t, "Acquire on a refused server", err, "")
			redistest.Within(t, 5*time.Second, "TryAcquireCtx", func() {
				ok, err := sem.TryAcquireCtx(context.Background(), 1)
				if ok {
					t.Errorf("TryAcquireCtx on a refused server: got true")
				}
				wantNodeErr(t, "TryAcquireCtx on a refused server", err, "")
			})
			if perr := recoverErr(func() { sem.TryAcquire(1) }); !errors.Is(perr, ErrQuorum) {
				t.Errorf("TryAcquire on a refused server: got panic %v, want one matching ErrQuorum", perr)
			}
		})
	}
}

// Waiters ride out a restart of Redis (down for 300ms): they acquire when
// it is back, as NetMutex's do. The holder's lease is gone with the restart
// (no persistence), and it is told.
func TestSemWaitersRideOutRestart(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		holder := e.newSem(t, "restart", 2, WithNodeTimeout(200*time.Millisecond))
		mustAcquire(t, holder, 2)
		const n = 4
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			s := e.newSem(t, "restart", 2, WithNodeTimeout(200*time.Millisecond))
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				err := s.Acquire(ctx, 1)
				errs <- err
				if err == nil {
					time.Sleep(10 * time.Millisecond) // held a while
					s.Release(1)
				}
			})
		}
		eventually(t, 5*time.Second, "the waiters queued", func() bool {
			q, _ := redis.Int(e.do(t, "ZCARD", keyspace.Sem(DefaultPrefix, "restart").Queue), nil)
			return q == n
		})
		e.server.Stop()
		time.Sleep(300 * time.Millisecond) // down for 300ms: the outage's length
		e.server.Restart()
		redistest.Within(t, 20*time.Second, "every waiter acquiring", wg.Wait)
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("a waiter across the restart: %v", err)
			}
		}
		redistest.Within(t, 20*time.Second, "the holder told its lease is lost", func() { <-holder.Lost() })
		if err := holder.ReleaseCtx(context.Background(), 2); !errors.Is(err, ErrLockLost) {
			t.Errorf("ReleaseCtx of the lost lease: %v, want ErrLockLost", err)
		}
	})
}

// A waiter whose process died keeps its place (and the smaller requests
// behind it out) for three expiries at most.
func TestSemDeadWaiterPlace(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const expiry = 400 * time.Millisecond
		holder := e.newSem(t, "deadw", 2, WithExpiry(expiry))
		mustAcquire(t, holder, 1)
		// A waiter for 2 that takes its place and dies: its script call,
		// made by hand, as its process would have before it died.
		dead := e.newSem(t, "deadw", 2, WithExpiry(expiry))
		args := []string{"v:0:1:2:" + dead.m.expiryMS + ":deadwaiter::" + dead.placeMS + ":" + dead.m.tombMS + ":::2@1"}
		if vals, err := dead.m.nodes[0].Eval(context.Background(), semAcquireScript, dead.keysOf("v"), args); err != nil || vals[0] != -1 {
			t.Fatalf("the dead waiter's attempt: %v, %v; want it refused", vals, err)
		}
		s := e.newSem(t, "deadw", 2, WithExpiry(expiry))
		if s.TryAcquire(1) {
			t.Fatal("TryAcquire got in past a waiter ahead")
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*expiry)
		defer cancel()
		if err := s.Acquire(ctx, 1); err != nil {
			t.Fatalf("a dead waiter's place kept a smaller request out for good: %v", err)
		}
		t.Logf("in %v after the dead waiter's place (expiry %v)", time.Since(start).Round(time.Millisecond), expiry)
		s.Release(1)
		holder.Release(1)
	})
}

// On a Redis Cluster: the bound holds, and a waiter is woken by the
// release (SPUBLISH), not by the lease's expiry.
func TestSemCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	var sems []*Semaphore
	for range 3 {
		s, err := NewSemaphore("csem", 2, []Backend{NewRueidis(newClusterClient(t, cluster))}, WithRetryDelay(time.Hour, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, s)
	}
	var in, most atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(700 * time.Millisecond)
	for _, s := range sems {
		for range 2 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err := s.Acquire(ctx, 1)
					cancel()
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					now := in.Add(1)
					for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
					}
					time.Sleep(time.Millisecond) // the section's length
					in.Add(-1)
					s.Release(1)
				}
			})
		}
	}
	wg.Wait()
	if most.Load() > 2 {
		t.Fatalf("%d permits held at once, size 2", most.Load())
	}
	mustAcquire(t, sems[0], 2)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		done <- sems[1].Acquire(ctx, 1)
	}()
	check := newClusterClient(t, cluster)
	queue := keyspace.Sem(DefaultPrefix, "csem").Queue
	eventually(t, 5*time.Second, "the waiter queued", func() bool {
		return clusterInt(t, check, check.B().Zcard().Key(queue).Build()) == 1
	})
	if len(done) != 0 {
		t.Fatal("a waiter got in while the semaphore was full")
	}
	sems[0].Release(2)
	if err := <-done; err != nil {
		t.Fatalf("a waiter was not woken by the release: %v", err)
	}
	sems[1].Release(1)
}

// TestSemSyncReplicas: with WithSyncReplicas(1), a lease is on the replica
// when Acquire returns; with the replica stalled, Acquire is refused as not
// replicated and leaves nothing out.
func TestSemSyncReplicas(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			p, r := startReplicated(t)
			caughtUp(t, p.Addr(), 1)
			sem, err := NewSemaphore("syncsem", 2, []Backend{newBackend(t, client, p.Addr())}, WithSyncReplicas(1), WithNodeTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			k := keyspace.Sem(DefaultPrefix, "syncsem")
			mustAcquire(t, sem, 1)
			if got, err := r.Do("ZCARD", k.Leases); got != "1" {
				t.Fatalf("leases on the replica as Acquire returned: %q (%v), want 1", got, err)
			}
			r.Pause()
			defer r.Resume()
			if err := sem.Acquire(context.Background(), 1); !errors.Is(err, ErrNotReplicated) {
				t.Fatalf("Acquire with the replica stalled: %v, want ErrNotReplicated", err)
			}
			if sem.Held() != 1 {
				t.Fatalf("Held: %d, want 1", sem.Held())
			}
			if got := sdo(t, p, "HGET", k.Permits, sem.value); got != "1" {
				t.Fatalf("the lease's permits on the primary after a refused Acquire: %q, want 1", got)
			}
			sem.Release(1)
			if v := sdo(t, p, "EXISTS", k.Leases); v != "0" {
				t.Error("the lease left on the primary")
			}
		})
	}
}

// The observer sees a Semaphore's acquires, extends and loss as
// KindSemaphore, and the log names it "name (semaphore)".
func TestSemObserverKind(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		var mu sync.Mutex
		var kinds []string
		obs := Observer{
			Acquire: func(_ context.Context, a AcquireStart) (context.Context, func(AcquireDone)) {
				return nil, func(d AcquireDone) {
					mu.Lock()
					kinds = append(kinds, "acquire:"+string(d.Kind))
					mu.Unlock()
				}
			},
			Lost: func(l LostHold) { mu.Lock(); kinds = append(kinds, "lost:"+string(l.Kind)); mu.Unlock() },
		}
		s := e.newSem(t, "obs", 1, WithObserver(obs), WithExpiry(100*time.Millisecond), WithAutoExtend(false))
		mustAcquire(t, s, 1)
		<-s.Lost()
		s.Release(1)
		eventually(t, 5*time.Second, "the events", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return strings.Join(kinds, " ") == "acquire:semaphore lost:semaphore"
		})
	})
}
