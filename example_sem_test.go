package netlock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// A Semaphore bounds concurrency across the fleet: here at most 3 calls to
// a payment provider at once, whichever process (replica) makes them. Every
// replica creates the Semaphore with the same name and size; each goroutine
// holds a permit for the length of its call.
func ExampleSemaphore() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()

	var inFlight, most atomic.Int64
	callProvider := func() {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		inFlight.Add(-1)
	}

	var wg sync.WaitGroup
	for range 2 { // two replicas, each with a Redis client of its own
		pool := newPool(srv.Addr())
		defer pool.Close()
		sem, err := netlock.NewSemaphore("payments", 3, []netlock.Backend{netlock.NewRedigo(pool)})
		if err != nil {
			panic(err)
		}
		for range 5 {
			wg.Go(func() {
				if err := sem.Acquire(context.Background(), 1); err != nil {
					panic(err)
				}
				defer sem.Release(1)
				callProvider()
			})
		}
	}
	wg.Wait()
	fmt.Println("at most 3 at once:", most.Load() <= 3)
	// Output: at most 3 at once: true
}

// Permits are weighted, and waiters are served in order: a report that
// needs all 4 slots is not starved by a stream of small jobs. TryAcquire
// never waits.
func ExampleSemaphore_TryAcquire() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()

	slots, err := netlock.NewSemaphore("gpu", 4, []netlock.Backend{netlock.NewRedigo(pool)})
	if err != nil {
		panic(err)
	}
	fmt.Println(slots.TryAcquire(3), slots.TryAcquire(2), slots.TryAcquire(1))
	slots.Release(4)

	err = slots.Acquire(context.Background(), 5)
	fmt.Println(err)
	// Output:
	// true false true
	// netlock: semaphore "gpu": Acquire of 5 permits, more than its size 4: it could never be granted
}
