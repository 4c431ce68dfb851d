package netlock_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/goredis"
)

// A program that already talks to Redis through go-redis makes its Backend
// with netlock/goredis. The client needs ContextTimeoutEnabled: netlock
// bounds every call to Redis with a context deadline.
func Example_goRedis() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	mu, err := netlock.New("nightly-report", []netlock.Backend{goredis.New(rdb)})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := mu.LockCtx(ctx); err != nil {
		panic(err)
	}
	fmt.Println("locked, fencing token", mu.Token())
	if err := mu.UnlockCtx(ctx); err != nil {
		panic(err)
	}
	fmt.Println("unlocked")
	// Output:
	// locked, fencing token 1
	// unlocked
}
