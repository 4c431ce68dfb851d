package goredis_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/goredis"
)

// A NetMutex on the go-redis client a program already has.
func Example() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	// ContextTimeoutEnabled: netlock bounds each call with a deadline.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	m, err := netlock.New("report", []netlock.Backend{goredis.New(rdb)})
	if err != nil {
		panic(err)
	}
	m.Lock()
	fmt.Println("locked, fencing token", m.Token())
	m.Unlock()
	fmt.Println("unlocked")
	// Output:
	// locked, fencing token 1
	// unlocked
}

// A waiter sleeps until the holder's release tells it its turn has come:
// two processes, each with a client of its own.
func Example_waiting() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	// Each process has a client of its own.
	var mutexes [2]*netlock.NetMutex
	for i := range mutexes {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
		defer rdb.Close()
		m, err := netlock.New("report", []netlock.Backend{goredis.New(rdb)})
		if err != nil {
			panic(err)
		}
		mutexes[i] = m
	}
	holder, waiter := mutexes[0], mutexes[1]

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := holder.LockCtx(ctx); err != nil {
		panic(err)
	}
	locked := make(chan error)
	go func() { locked <- waiter.LockCtx(ctx) }()
	time.Sleep(50 * time.Millisecond) // the waiter is waiting now
	fmt.Println("holder unlocks")
	if err := holder.UnlockCtx(ctx); err != nil {
		panic(err)
	}
	if err := <-locked; err != nil {
		panic(err)
	}
	fmt.Println("waiter locked, fencing token", waiter.Token())
	if err := waiter.UnlockCtx(ctx); err != nil {
		panic(err)
	}
	// Output:
	// holder unlocks
	// waiter locked, fencing token 2
}
