package netlock

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// BenchmarkLockUnlock measures one uncontended LockCtx+UnlockCtx: two round
// trips (acquire, release) on each node, in parallel over a quorum.
//
//	go test -run '^$' -bench LockUnlock -benchmem .
func BenchmarkLockUnlock(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, backends []Backend) {
		m, err := New("bench", backends)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		defer reportCPU(b)()
		for b.Loop() {
			if err := m.LockCtx(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.UnlockCtx(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, client := range testClients() {
		b.Run("miniredis/"+client, func(b *testing.B) {
			run(b, []Backend{newBackend(b, client, miniredis.RunT(b).Addr())})
		})
	}
	for _, n := range []int{1, 3, 5} {
		for _, client := range testClients() {
			b.Run(fmt.Sprintf("redis-%d/%s", n, client), func(b *testing.B) {
				backends := make([]Backend, n)
				for i := range backends {
					backends[i] = newBackend(b, client, redistest.Start(b).Addr())
				}
				run(b, backends)
			})
		}
	}
}

// BenchmarkLockUnlockKeys measures uncontended LockCtx+UnlockCtx pairs on
// independent keys: 64 goroutines, each looping on a lock name of its own,
// over one client (a redigo pool with room for them all, as bench/ has).
//
//	go test -run '^$' -bench LockUnlockKeys -benchmem .
func BenchmarkLockUnlockKeys(b *testing.B) {
	const goroutines = 64
	ctx := context.Background()
	for _, client := range []string{"redigo", "rueidis"} {
		b.Run(client, func(b *testing.B) {
			addr := redistest.Start(b).Addr()
			backend := newBackend(b, client, addr)
			if client == "redigo" {
				pool := &redis.Pool{
					MaxIdle:     2 * goroutines,
					DialContext: func(ctx context.Context) (redis.Conn, error) { return redis.DialContext(ctx, "tcp", addr) },
				}
				b.Cleanup(func() { pool.Close() })
				backend = NewRedigo(pool)
			}
			var names atomic.Int64
			b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.ResetTimer()
			defer reportCPU(b)()
			b.RunParallel(func(pb *testing.PB) {
				m, err := New(fmt.Sprintf("keys-%d", names.Add(1)), []Backend{backend})
				if err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					if err := m.LockCtx(ctx); err != nil {
						b.Error(err)
						return
					}
					if err := m.UnlockCtx(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// reportCPU starts measuring the CPU time of this process, the client's
// (the servers are processes of their own), and returns the function that
// reports it per op, as cpu-µs/op: on a busy machine a steadier measure of
// the client's cost than ns/op, which also counts the waits for the server
// and for a CPU.
func reportCPU(b *testing.B) func() {
	start := processCPU()
	return func() {
		if used := processCPU() - start; used > 0 && b.N > 0 {
			b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/op")
		}
	}
}

// BenchmarkFloor measures what an uncontended lock cannot beat, on the same
// server and clients as BenchmarkLockUnlock: a PING round trip, and a
// hand-written lock cycle of two round trips (SET key value NX PX, then a
// compare-and-delete script by EVALSHA), without netlock.
//
//	go test -run '^$' -bench 'Floor|LockUnlock/redis-1' -benchmem .
func BenchmarkFloor(b *testing.B) {
	ctx := context.Background()
	const del = `if redis.call('GET', KEYS[1]) == ARGV[1] then return {redis.call('DEL', KEYS[1])} end return {0}`
	s := newScript("floor", del)
	addr := redistest.Start(b).Addr()
	for _, client := range []string{"redigo", "rueidis"} {
		backend := newBackend(b, client, addr)
		b.Run("ping/"+client, func(b *testing.B) {
			ping := floorPing(b, backend)
			for b.Loop() {
				if err := ping(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("setnx+evalsha/"+client, func(b *testing.B) {
			set := floorSet(b, backend)
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				if err := set(ctx, "floor", "v", "8000"); err != nil {
					b.Fatal(err)
				}
				if _, err := backend.Eval(ctx, s, []string{"floor"}, []string{"v"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func floorPing(b *testing.B, backend Backend) func(context.Context) error {
	switch c := backend.(type) {
	case *redigoBackend:
		return func(ctx context.Context) error {
			conn, err := c.pool.GetContext(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = redis.DoContext(conn, ctx, "PING")
			return err
		}
	case *rueidisBackend:
		return func(ctx context.Context) error {
			return c.client.Do(ctx, c.client.B().Ping().Build()).Error()
		}
	}
	b.Fatalf("no PING for %T", backend)
	return nil
}

func floorSet(b *testing.B, backend Backend) func(ctx context.Context, key, value, px string) error {
	switch c := backend.(type) {
	case *redigoBackend:
		return func(ctx context.Context, key, value, px string) error {
			conn, err := c.pool.GetContext(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = redis.String(redis.DoContext(conn, ctx, "SET", key, value, "NX", "PX", px))
			return err
		}
	case *rueidisBackend:
		return func(ctx context.Context, key, value, px string) error {
			return c.client.Do(ctx, c.client.B().Set().Key(key).Value(value).Nx().PxMilliseconds(8000).Build()).Error()
		}
	}
	b.Fatalf("no SET for %T", backend)
	return nil
}

// BenchmarkHandoverDeadWaiters measures a hand-over from an Unlock to the
// next live waiter, a client of its own, with 0, 1 or 3 waiters ahead of it
// in the queue that died (their connections closed, as when their process
// is killed): the time from the Unlock call to the waiter's LockCtx
// returning. The release skips the dead ones in its own script, so they
// should cost next to nothing; the p50 is reported as handover-p50-µs.
//
//	go test -run '^$' -bench HandoverDeadWaiters .
func BenchmarkHandoverDeadWaiters(b *testing.B) {
	for _, client := range testClients() {
		for _, dead := range []int{0, 1, 3} {
			b.Run(fmt.Sprintf("%s/dead=%d", client, dead), func(b *testing.B) {
				s := redistest.Start(b)
				holder, err := New("handover", []Backend{newBackend(b, client, s.Addr())})
				if err != nil {
					b.Fatal(err)
				}
				live, err := New("handover", []Backend{newBackend(b, client, s.Addr())})
				if err != nil {
					b.Fatal(err)
				}
				var times []time.Duration
				for b.Loop() {
					b.StopTimer()
					mustLock(b, holder)
					var cancels []func()
					for range dead {
						p := redistest.StartProxy(b, s.Addr())
						d, err := New("handover", []Backend{newBackend(b, client, p.Addr())})
						if err != nil {
							b.Fatal(err)
						}
						ctx, cancel := context.WithCancel(context.Background())
						done := make(chan struct{})
						go func() { d.LockCtx(ctx); close(done) }()
						cancels = append(cancels, func() { cancel(); <-done })
						waitQueued(b, s, holder.keys.waiters, len(cancels))
						p.Close()
					}
					locked := make(chan error, 1)
					go func() { locked <- live.LockCtx(context.Background()) }()
					waitQueued(b, s, holder.keys.waiters, dead+1)
					b.StartTimer()
					start := time.Now()
					holder.Unlock()
					if err := <-locked; err != nil {
						b.Fatal(err)
					}
					times = append(times, time.Since(start))
					b.StopTimer()
					live.Unlock()
					for _, c := range cancels {
						c()
					}
					b.StartTimer()
				}
				slices.Sort(times)
				b.ReportMetric(float64(times[len(times)/2].Microseconds()), "handover-p50-µs")
			})
		}
	}
}

// waitQueued waits until the waiters' queue holds n members.
func waitQueued(b *testing.B, s *redistest.Server, queue string, n int) {
	b.Helper()
	eventually(b, 5*time.Second, fmt.Sprintf("the waiters' queue reaching %d members", n), func() bool {
		v, err := s.Do("ZCARD", queue)
		return err == nil && v == strconv.Itoa(n)
	})
}
