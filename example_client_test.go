package netlock_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// A Client takes the backends and options once. Goroutines that ask it for
// the same name while one of them uses the lock share one lock object, and
// hand the hold on to each other without a round trip.
func ExampleClient() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()

	locks, err := netlock.NewClient([]netlock.Backend{netlock.NewRedigo(pool)})
	if err != nil {
		panic(err)
	}
	balances := map[string]int{"alice": 100, "bob": 100}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			mu, err := locks.Mutex("balance:alice") // one per request, as a handler would
			if err != nil {
				panic(err)
			}
			mu.Lock()
			if balances["alice"] >= 10 { // check, then act
				balances["alice"] -= 10
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	fmt.Println("alice:", balances["alice"])
	// Output: alice: 0
}

// TryDo runs a job only where the lock is free right now: a replica skips
// it, without waiting, while another runs it, and runs it once that run has
// returned.
func ExampleTryDo() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx := context.Background()

	// Two replicas, each with its own client and lock object.
	var replicas []*netlock.NetMutex
	for range 2 {
		pool := newPool(srv.Addr())
		defer pool.Close()
		mu, err := netlock.New("nightly-job", []netlock.Backend{netlock.NewRedigo(pool)})
		if err != nil {
			panic(err)
		}
		replicas = append(replicas, mu)
	}

	replicas[1].Lock() // the other replica is running the job right now
	for i, mu := range replicas[:1] {
		_, ran, err := netlock.TryDo(ctx, mu, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, nil // the job
		})
		fmt.Printf("replica %d ran the job: %v (err %v)\n", i, ran, err)
	}
	replicas[1].Unlock()
	_, ran, err := netlock.TryDo(ctx, replicas[0], func(ctx context.Context) (string, error) {
		return "done", nil
	})
	fmt.Printf("once the other is done, replica 0 ran the job: %v (err %v)\n", ran, err)
	// Output:
	// replica 0 ran the job: false (err <nil>)
	// once the other is done, replica 0 ran the job: true (err <nil>)
}
