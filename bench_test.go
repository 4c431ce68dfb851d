package netlock

import (
	"context"
	"fmt"
	"testing"

	"github.com/alicebob/miniredis/v2"

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
