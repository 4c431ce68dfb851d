package netlocktest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/netlocktest"
)

func newOnce(t *testing.T, name string, b netlock.Backend, opts ...netlock.Option) *netlock.Once {
	t.Helper()
	o, err := netlock.NewOnce(name, []netlock.Backend{b}, append([]netlock.Option{netlock.WithExpiry(expiry)}, opts...)...)
	if err != nil {
		t.Fatalf("netlock.NewOnce: %v", err)
	}
	return o
}

// A Once whose runner dies while its job runs: FastForward past the
// runner's expiry lets the caller waiting run the job at once, in real
// time; the dead runner records nothing. WithRemember's duration passes
// with FastForward too: the next Do runs the job again.
func TestOnceDeadRunnerAndRemember(t *testing.T) {
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			s := netlocktest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			// The runner stands for a process that died mid-job: nothing
			// extends its hold.
			runner := newOnce(t, "migrate", c.backend(s), netlock.WithAutoExtend(false))
			started := make(chan struct{})
			first := make(chan error, 1)
			go func() {
				_, err := runner.Do(ctx, func(ctx context.Context) error {
					close(started)
					<-ctx.Done() // the hold lost
					return nil   // too late: nothing is recorded
				})
				first <- err
			}()
			<-started
			waiter := newOnce(t, "migrate", c.backend(s), netlock.WithRemember(time.Hour))
			second := make(chan bool, 1)
			go func() {
				ran, err := waiter.Do(ctx, func(context.Context) error { return nil })
				if err != nil {
					t.Errorf("the waiter's Do: %v", err)
				}
				second <- ran
			}()
			eventually(t, "the waiter is queued", func() bool { return queued(s, "netlock:{migrate}:once:waiters") == 1 })

			s.FastForward(expiry + time.Second)
			if err := <-first; !errors.Is(err, netlock.ErrLockLost) {
				t.Errorf("the dead runner's Do: got %v, want ErrLockLost", err)
			}
			if !<-second {
				t.Fatal("the waiter did not run the job once the runner's hold expired")
			}
			if ran, err := waiter.Do(ctx, func(context.Context) error { return nil }); ran || err != nil {
				t.Errorf("Do while remembered: got %v, %v; want false, nil", ran, err)
			}
			s.FastForward(time.Hour)
			if ran, err := waiter.Do(ctx, func(context.Context) error { return nil }); !ran || err != nil {
				t.Errorf("Do after WithRemember's hour: got %v, %v; want true, nil", ran, err)
			}
		})
	}
}
