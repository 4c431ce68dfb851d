package goredis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/redistest"
)

// BenchmarkLockUnlock is one goroutine's uncontended lock + unlock on a real
// server: a NetMutex on this package's Backend, beside the hand-written
// cycle on the same client (SET NX PX, then EVALSHA compare-and-delete),
// the floor that the allocations per cycle are compared with (bench/'s
// uncontended row measures the same with its harness).
func BenchmarkLockUnlock(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	b.Run("netlock", func(b *testing.B) {
		m := newMutex(b, "bench", []netlock.Backend{New(newClient(b, s.Addr()))})
		b.ReportAllocs()
		for b.Loop() {
			if err := m.LockCtx(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.UnlockCtx(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("hand-written", func(b *testing.B) {
		c := newClient(b, s.Addr())
		del := redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
		b.ReportAllocs()
		for b.Loop() {
			ok, err := c.SetNX(ctx, "bench-floor", "value", 10*time.Second).Result()
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			if err := del.Run(ctx, c, []string{"bench-floor"}, "value").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestBoxesBounded: the boxed arguments a Backend keeps stay within
// boxesMax however many distinct ones pass, and fill puts each key and
// argument in its place.
func TestBoxesBounded(t *testing.T) {
	var c boxes
	dst := make([]any, 3)
	for i := range 3 * boxesMax {
		value := fmt.Sprint("value-", i)
		c.fill(dst, []string{"p{a}", "p{a}:waiters"}, []string{value})
		if dst[0] != "p{a}" || dst[1] != "p{a}:waiters" || dst[2] != value {
			t.Fatalf("fill %d: got %v", i, dst)
		}
		if n := len(c.m); n > boxesMax {
			t.Fatalf("fill %d: %d arguments kept, want at most %d", i, n, boxesMax)
		}
	}
}
