package netlock

import (
	"context"
	"fmt"
	"testing"

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
		for b.Loop() {
			if err := m.LockCtx(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.UnlockCtx(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, client := range []string{"redigo", "rueidis"} {
		b.Run("miniredis/"+client, func(b *testing.B) {
			run(b, []Backend{newBackend(b, client, miniredis.RunT(b).Addr())})
		})
	}
	for _, n := range []int{1, 3, 5} {
		for _, client := range []string{"redigo", "rueidis"} {
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
