package netlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/redistest"
)

// TestOnceCron is the cron recipe of docs/usage.md, runTick (see
// ExampleOnce_cron), on the clock: three replicas, each with a Redis client
// of its own, whose schedulers fire every tick of a 1s period 0, 150 and
// 300ms apart, with a job that lasts 50ms or 400ms. Every tick runs the
// job exactly once, and none is skipped: a replica that comes while the job
// runs waits for it and finds it done; one that comes after finds it done.
func TestOnceCron(t *testing.T) {
	servers := map[string]func(t *testing.T) string{
		"miniredis": func(t *testing.T) string { return miniredis.RunT(t).Addr() },
		"redis":     func(t *testing.T) string { return redistest.Start(t).Addr() },
	}
	for _, server := range []string{"miniredis", "redis"} {
		for _, job := range []time.Duration{50 * time.Millisecond, 400 * time.Millisecond} {
			t.Run(server+"/"+job.String(), func(t *testing.T) {
				t.Parallel()
				testCron(t, servers[server](t), job)
			})
		}
	}
}

// testCron runs the cron scenario on the server at addr with a job of the
// given length.
func testCron(t *testing.T, addr string, job time.Duration) {
	const (
		period = time.Second
		ticks  = 3
	)
	skews := []time.Duration{0, 150 * time.Millisecond, 300 * time.Millisecond}
	var (
		mu   sync.Mutex
		runs = map[time.Time]int{} // by tick
	)
	first := time.Now().Truncate(period).Add(period) // the next tick
	var wg sync.WaitGroup
	for _, skew := range skews {
		pool := newPool(addr)
		t.Cleanup(func() { pool.Close() })
		locks, err := netlock.NewClient([]netlock.Backend{netlock.NewRedigo(pool)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			// This replica's scheduler: a timer for each of its ticks, skew
			// after the period's; each tick's run on a goroutine of its own,
			// as a cron library runs its jobs.
			timer := time.NewTimer(time.Until(first.Add(skew)))
			defer timer.Stop()
			var runsWG sync.WaitGroup
			defer runsWG.Wait()
			for k := range ticks {
				<-timer.C
				fired := time.Now()
				runsWG.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 2*period)
					defer cancel()
					_, err := runTick(ctx, locks, "report", period, fired, func(ctx context.Context) error {
						mu.Lock()
						runs[fired.Round(period)]++
						mu.Unlock()
						time.Sleep(job) // the job's work
						return nil
					})
					if err != nil {
						t.Errorf("tick %d, %v after the period's: %v", k, skew, err)
					}
				})
				timer.Reset(time.Until(first.Add(time.Duration(k+1)*period + skew)))
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for k := range ticks {
		at := first.Add(time.Duration(k) * period).Round(period)
		if runs[at] != 1 {
			t.Errorf("tick %d (%s): the job ran %d times, want 1", k, at.Format("15:04:05"), runs[at])
		}
		delete(runs, at)
	}
	for at, n := range runs {
		t.Errorf("the job ran %d times for a tick %s that was not fired", n, at.Format("15:04:05.000"))
	}
}
