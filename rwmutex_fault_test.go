package netlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// quorumRW returns a NetRWMutex over servers, with clients of its own.
func quorumRW(t *testing.T, client string, servers []*redistest.Server, name string, opts ...Option) *NetRWMutex {
	t.Helper()
	backends := make([]Backend, len(servers))
	for i, s := range servers {
		backends[i] = newBackend(t, client, s.Addr())
	}
	rw, err := NewRW(name, backends, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return rw
}

// rwKeysOf returns the Redis keys of the NetRWMutex name, default prefix.
func rwKeysOf(name string) []string {
	k := keyspace.RW(DefaultPrefix, name, true)
	return []string{k.Writer, k.Writers, k.Readers, k.Leases}
}

// rwWorkload runs readers and writers on rws (one per process) for d, and
// checks that no writer overlaps anyone and that writers' tokens never
// decrease in the order of their sections.
func rwWorkload(t *testing.T, rws []*NetRWMutex, d time.Duration) *rwChecker {
	t.Helper()
	var c rwChecker
	var wg sync.WaitGroup
	var mu sync.Mutex
	var last uint64
	deadline := time.Now().Add(d)
	// Past d, on until both kinds ran at least once (a loaded machine,
	// a quorum with a node down): at most a minute more.
	bothBy := deadline.Add(time.Minute)
	going := func() bool {
		now := time.Now()
		return now.Before(deadline) || now.Before(bothBy) && (c.reads.Load() == 0 || c.writes.Load() == 0)
	}
	for p, rw := range rws {
		for g := range 2 {
			wg.Go(func() {
				for going() {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					if (p+g)%2 == 0 && rand.N(4) == 0 {
						if err := rw.LockCtx(ctx); err != nil {
							t.Errorf("LockCtx: %v", err)
							cancel()
							return
						}
						mu.Lock()
						// A write lock handed to another writer of its
						// process keeps its token (see docs/waiting.md,
						// "Local hand-off"): tokens never go down, and
						// go up from process to process.
						if tok := rw.Token(); tok < last {
							t.Errorf("token %d after %d", tok, last)
						} else {
							last = tok
						}
						mu.Unlock()
						c.write(time.Duration(rand.N(500)) * time.Microsecond)
						if err := rw.UnlockCtx(context.Background()); err != nil {
							t.Errorf("UnlockCtx: %v", err)
						}
					} else {
						if err := rw.RLockCtx(ctx); err != nil {
							t.Errorf("RLockCtx: %v", err)
							cancel()
							return
						}
						c.read(time.Duration(rand.N(500)) * time.Microsecond)
						if err := rw.RUnlockCtx(context.Background()); err != nil {
							t.Errorf("RUnlockCtx: %v", err)
						}
					}
					cancel()
				}
			})
		}
	}
	redistest.Within(t, d+2*time.Minute, "the read/write workload", wg.Wait)
	if v := c.violations.Load(); v != 0 {
		t.Fatalf("%d overlaps of a writer with another holder (%d reads, %d writes)", v, c.reads.Load(), c.writes.Load())
	}
	if c.reads.Load() == 0 || c.writes.Load() == 0 {
		t.Fatalf("%d reads, %d writes: the workload did not run both", c.reads.Load(), c.writes.Load())
	}
	return &c
}

func TestRWQuorum(t *testing.T) {
	for _, n := range []int{3, 5} {
		for _, client := range testClients() {
			t.Run(fmt.Sprintf("%d/%s", n, client), func(t *testing.T) {
				servers := startServers(t, n)
				var rws []*NetRWMutex
				for range 4 {
					rws = append(rws, quorumRW(t, client, servers, "qrw"))
				}
				c := rwWorkload(t, rws, 700*time.Millisecond)
				t.Logf("%d reads, %d writes", c.reads.Load(), c.writes.Load())
				for _, s := range servers {
					for _, k := range rwKeysOf("qrw") {
						if v := sdo(t, s, "EXISTS", k); v != "0" {
							t.Errorf("%s left on %s", k, s.Addr())
						}
					}
				}
			})
		}
	}
}

// TestRWQuorumMinorityDown: with one node of three killed, readers and
// writers go on.
func TestRWQuorumMinorityDown(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			// Runs after the clients are closed (cleanups run last first).
			t.Cleanup(func() { waitGoRedisRedials(t) })
			servers := startServers(t, 3)
			opts := []Option{WithNodeTimeout(200 * time.Millisecond)}
			var rws []*NetRWMutex
			for range 3 {
				rws = append(rws, quorumRW(t, client, servers, "minority", opts...))
			}
			servers[2].Kill()
			rwWorkload(t, rws, 500*time.Millisecond)
		})
	}
}

// TestRWWriterHeardAtOnce: a process whose readers keep its lease held all
// the time lets a writer of another process in as soon as it hears of it,
// not at its lease's next extend: here there is none (auto-extend off, an
// expiry of 8s), so a writer let in before the expiry was heard.
func TestRWWriterHeardAtOnce(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		opts := []Option{WithAutoExtend(false), WithExpiry(8 * time.Second)}
		r := e.newRW(t, "heard", opts...)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		r.RLock() // the lease, and its watch, before the writer comes
		joined := keyspace.RW(DefaultPrefix, "heard", true).Joined
		eventually(t, 5*time.Second, "the lease's watch listening", func() bool { return numsub(t, e, joined) >= 1 })
		var reading sync.WaitGroup // every reader in its first section
		reading.Add(3)
		for range 3 {
			wg.Go(func() {
				first := true
				for {
					select {
					case <-stop:
						return
					default:
					}
					r.RLock()
					if first {
						reading.Done()
						first = false
					}
					time.Sleep(2 * time.Millisecond) // a read section's length
					r.RUnlock()
				}
			})
		}
		redistest.Within(t, 5*time.Second, "every reader reading", reading.Wait)
		r.RUnlock()
		w := e.newRW(t, "heard", opts...)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		err := w.LockCtx(ctx)
		close(stop)
		if err == nil {
			w.Unlock()
		}
		wg.Wait()
		if err != nil {
			t.Fatalf("a writer waited for a lease of readers that never stopped joining it: %v", err)
		}
	})
}

// TestRWLeaseLost: a read lease whose key is deleted is found lost by its
// next extend: RLost is closed, and the last RUnlock says ErrLockLost.
func TestRWLeaseLost(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		rw := e.newRW(t, "lost", WithExpiry(600*time.Millisecond))
		rw.RLock()
		rw.RLock()
		lost := rw.RLost()
		e.do(t, "DEL", rwKeysOf("lost")[3])
		select {
		case <-lost:
		case <-time.After(3 * time.Second):
			t.Fatal("RLost not closed 3s after the lease was deleted")
		}
		if err := rw.RUnlockCtx(context.Background()); err != nil {
			t.Fatalf("first RUnlockCtx: %v", err)
		}
		if err := rw.RUnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Fatalf("last RUnlockCtx of a lost lease: %v, want ErrLockLost", err)
		}
		// And the name works again.
		rw.Lock()
		rw.Unlock()
		rw.RLock()
		rw.RUnlock()
	})
}

// TestRWDeadWaiterPlace: a writer whose process died while it waited
// keeps readers out for at most placeExpiries expiries.
func TestRWDeadWaiterPlace(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const expiry = 400 * time.Millisecond
		r := e.newRW(t, "dead", WithExpiry(expiry))
		r.RLock()
		// A writer that takes its place and dies: its script call, made by
		// hand, as its process would have before it died.
		dead := e.newRW(t, "dead", WithExpiry(expiry))
		s, keys, args := dead.w.kind.acquireCall("v", dead.w.tomb("v", ""), "0", ask{member: "deadwriter", flags: "j"})
		if _, err := dead.w.nodes[0].Eval(context.Background(), s, keys, args); err != nil {
			t.Fatal(err)
		}
		r2 := e.newRW(t, "dead", WithExpiry(expiry))
		if r2.TryRLock() {
			t.Fatal("a reader got in past a waiting writer")
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*expiry)
		defer cancel()
		if err := r2.RLockCtx(ctx); err != nil {
			t.Fatalf("a dead writer's place kept a reader out for good: %v", err)
		}
		t.Logf("reader in %v after the dead writer's place (expiry %v)", time.Since(start).Round(time.Millisecond), expiry)
		r2.RUnlock()
		r.RUnlock()
	})
}

// TestRWBadInput: keys of another type, scripts flushed, a stalled server.
func TestRWBadInput(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			s := redistest.Start(t)
			newRW := func(name string, opts ...Option) *NetRWMutex {
				rw, err := NewRW(name, []Backend{newBackend(t, client, s.Addr())}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				return rw
			}
			for _, k := range rwKeysOf("wrong") {
				t.Run("WRONGTYPE/"+k, func(t *testing.T) {
					sdo(t, s, "FLUSHALL")
					sdo(t, s, "HSET", k, "field", "kept")
					rw := newRW("wrong")
					for _, what := range []string{"LockCtx", "RLockCtx"} {
						if what == "RLockCtx" && strings.HasSuffix(k, ":readers") {
							// A reader that finds no writer takes its
							// lease without looking at the readers'
							// queue; a writer does look (LockCtx above).
							continue
						}
						var err error
						redistest.Within(t, 5*time.Second, what, func() {
							if what == "LockCtx" {
								err = rw.LockCtx(context.Background())
							} else {
								err = rw.RLockCtx(context.Background())
							}
						})
						wantNodeErr(t, what+" on a hash", err, "WRONGTYPE")
					}
					if v := sdo(t, s, "HGET", k, "field"); v != "kept" {
						t.Errorf("the hash after the failed lock: got %q, want it untouched", v)
					}
				})
			}
			t.Run("SCRIPT FLUSH", func(t *testing.T) {
				sdo(t, s, "FLUSHALL")
				rw := newRW("flushed")
				rw.RLock()
				rw.RUnlock()
				sdo(t, s, "SCRIPT", "FLUSH")
				rw.Lock()
				rw.Unlock()
				rw.RLock()
				rw.RUnlock()
			})
			t.Run("stalled", func(t *testing.T) {
				sdo(t, s, "FLUSHALL")
				rw := newRW("stalled", WithNodeTimeout(200*time.Millisecond), WithOutageWindow(hostileOutage))
				rw.RLock()
				rw.RUnlock()
				s.Pause()
				var werr, rerr error
				redistest.Within(t, 5*time.Second, "LockCtx", func() { werr = rw.LockCtx(context.Background()) })
				redistest.Within(t, 5*time.Second, "RLockCtx", func() { rerr = rw.RLockCtx(context.Background()) })
				s.Resume()
				wantNodeErr(t, "LockCtx on a stalled server", werr, "")
				wantNodeErr(t, "RLockCtx on a stalled server", rerr, "")
				eventually(t, 3*time.Second, "every lease and the write lock gone after the failed attempts", func() bool {
					left := 0
					for _, k := range rwKeysOf("stalled") {
						switch {
						case strings.HasSuffix(k, ":writers") || strings.HasSuffix(k, ":readers"):
							continue // a place is kept for three expiries at most
						case strings.HasSuffix(k, ":leases"):
							// Leases have positive scores; places (whose
							// leave the stalled server did not take) are
							// below zero.
							if sdo(t, s, "ZCOUNT", k, "0", "+inf") != "0" {
								left++
							}
						default:
							if sdo(t, s, "EXISTS", k) != "0" {
								left++
							}
						}
					}
					return left == 0
				})
				rw.Lock()
				rw.Unlock()
				rw.RLock()
				rw.RUnlock()
			})
		})
	}
}

// TestRWCluster runs the read/write workload on a Redis Cluster, with
// waiters woken by sharded pub/sub.
func TestRWCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	var rws []*NetRWMutex
	for range 3 {
		rw, err := NewRW("crw", []Backend{NewRueidis(newClusterClient(t, cluster))})
		if err != nil {
			t.Fatal(err)
		}
		rws = append(rws, rw)
	}
	c := rwWorkload(t, rws, 700*time.Millisecond)
	t.Logf("%d reads, %d writes", c.reads.Load(), c.writes.Load())
	// A reader waiting behind a writer is woken by the writer's release
	// (SPUBLISH), not by its TTL (8s).
	rws[0].Lock()
	var in atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		if err := rws[1].RLockCtx(ctx); err != nil {
			t.Errorf("a reader waiting behind a writer was not woken by its release: %v", err)
			return
		}
		in.Store(true)
		rws[1].RUnlock()
	}()
	check := newClusterClient(t, cluster)
	readers := keyspace.RW(DefaultPrefix, "crw", true).Readers
	eventually(t, 5*time.Second, "the reader queued behind the writer", func() bool {
		return clusterInt(t, check, check.B().Zcard().Key(readers).Build()) == 1
	})
	if in.Load() {
		t.Fatal("a reader got in while a writer held")
	}
	rws[0].Unlock()
	<-done
}

// TestRWSyncReplicas: with WithSyncReplicas(1), a read lease and the write
// lock are on the replica when RLockCtx and LockCtx return; with the
// replica stalled, both are refused as not replicated, and leave nothing.
func TestRWSyncReplicas(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			p, r := startReplicated(t)
			caughtUp(t, p.Addr(), 1)
			rw, err := NewRW("syncrw", []Backend{newBackend(t, client, p.Addr())}, WithSyncReplicas(1), WithNodeTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			k := keyspace.RW(DefaultPrefix, "syncrw", true)
			rw.RLock()
			if got, err := r.Do("ZCARD", k.Leases); got != "1" {
				t.Fatalf("leases on the replica as RLockCtx returned: %q (%v), want 1", got, err)
			}
			rw.RUnlock()
			rw.Lock()
			if got, err := r.Do("EXISTS", k.Writer); got != "1" {
				t.Fatalf("writer key on the replica as LockCtx returned: %q (%v)", got, err)
			}
			rw.Unlock()

			r.Pause()
			defer r.Resume()
			if err := rw.RLockCtx(context.Background()); !errors.Is(err, ErrNotReplicated) {
				t.Fatalf("RLockCtx with the replica stalled: %v, want ErrNotReplicated", err)
			}
			if err := rw.LockCtx(context.Background()); !errors.Is(err, ErrNotReplicated) {
				t.Fatalf("LockCtx with the replica stalled: %v, want ErrNotReplicated", err)
			}
			for _, key := range []string{k.Writer, k.Leases} {
				if v := sdo(t, p, "EXISTS", key); v != "0" {
					t.Errorf("%s left on the primary after a refused acquire", key)
				}
			}
		})
	}
}

// waitGoRedisRedials waits (at most 5s) until the goroutines that a
// go-redis pool starts to dial a server that refused it again and again
// have ended: each looks once a second whether its pool was closed
// (go-redis v9.17.3, internal/pool, tryDial), so that goleak in TestMain
// does not report them.
func waitGoRedisRedials(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !strings.Contains(string(buf[:n]), "go-redis/v9/internal/pool.(*ConnPool).tryDial") {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("go-redis's redial goroutines still running after 5s; goleak will report them")
			return
		}
		time.Sleep(50 * time.Millisecond) // between looks at the stacks
	}
}
