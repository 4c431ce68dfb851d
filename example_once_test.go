package netlock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// A Once runs a migration once, however many pods start at once: one runs
// it, the others wait until it has finished, then go on without running it.
func ExampleOnce() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()

	var runs atomic.Int32
	var wg sync.WaitGroup
	for range 3 { // three pods, each with a Redis client of its own
		pool := newPool(srv.Addr())
		defer pool.Close()
		once, err := netlock.NewOnce("migrate:v42", []netlock.Backend{netlock.NewRedigo(pool)})
		if err != nil {
			panic(err)
		}
		wg.Go(func() {
			_, err := once.Do(context.Background(), func(ctx context.Context) error {
				runs.Add(1) // the migration; an error would let the next pod run it
				return nil
			})
			if err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("migration runs:", runs.Load())
	// Output: migration runs: 1
}

// runTick runs fn for the tick of a schedule at tick, once across every
// replica that calls it for that tick: the Once is named by the tick
// rounded to the period, so replicas whose ticks fire up to half a period
// apart name the same one, and it is remembered for a few periods, so that
// a late replica finds it done, and then forgotten.
func runTick(ctx context.Context, locks *netlock.Client, job string, period time.Duration, tick time.Time, fn func(ctx context.Context) error) (ran bool, err error) {
	name := job + ":" + tick.Round(period).UTC().Format(time.RFC3339Nano)
	once, err := locks.Once(name, netlock.WithRemember(3*period))
	if err != nil {
		return false, err
	}
	return once.Do(ctx, fn)
}

// A job runs exactly once per tick of its schedule on one of three
// replicas, whose clocks and schedulers are a little apart: each calls
// runTick at each of its ticks.
func ExampleOnce_cron() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()

	var replicas []*netlock.Client
	for range 3 { // each replica with a Redis client of its own
		pool := newPool(srv.Addr())
		defer pool.Close()
		locks, err := netlock.NewClient([]netlock.Backend{netlock.NewRedigo(pool)})
		if err != nil {
			panic(err)
		}
		replicas = append(replicas, locks)
	}

	const period = time.Hour
	noon := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	report := func(ctx context.Context) error { return nil } // the job
	for _, tick := range []struct {
		replica int
		at      time.Time
	}{
		{0, noon}, // the tick of 12:00 as each replica's scheduler fires it
		{1, noon.Add(150 * time.Millisecond)},
		{2, noon.Add(300 * time.Millisecond)},
		{2, noon.Add(period - 200*time.Millisecond)}, // 13:00, a clock ahead
		{0, noon.Add(period)},
		{1, noon.Add(period + 100*time.Millisecond)},
	} {
		ran, err := runTick(context.Background(), replicas[tick.replica], "report", period, tick.at, report)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s on replica %d: ran %v\n", tick.at.Round(period).Format("15:04"), tick.replica, ran)
	}
	// Output:
	// 12:00 on replica 0: ran true
	// 12:00 on replica 1: ran false
	// 12:00 on replica 2: ran false
	// 13:00 on replica 2: ran true
	// 13:00 on replica 0: ran false
	// 13:00 on replica 1: ran false
}
