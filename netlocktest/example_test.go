package netlocktest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/netlocktest"
)

// A holder dies without unlocking; the test moves time past its expiry,
// and the waiter has the lock at once, without sleeping a minute.
func Example() {
	t := &exampleTB{} // in a test: its t
	defer t.cleanup()

	s := netlocktest.New(t)
	ctx := context.Background()

	// The holder's process dies: it never unlocks, and nothing extends
	// its key.
	holder, _ := netlock.New("report", []netlock.Backend{s.Redigo()}, netlock.WithExpiry(time.Minute), netlock.WithAutoExtend(false))
	holder.Lock()

	waiter, _ := netlock.New("report", []netlock.Backend{s.Rueidis()}, netlock.WithExpiry(time.Minute))
	got := make(chan error, 1)
	go func() { got <- waiter.LockCtx(ctx) }()

	s.FastForward(time.Minute + time.Second)
	fmt.Println("waiter's LockCtx:", <-got)
	select {
	case <-holder.Lost():
		fmt.Println("holder's Lost: closed")
	default:
		fmt.Println("holder's Lost: open")
	}
	waiter.Unlock()
	// Output:
	// waiter's LockCtx: <nil>
	// holder's Lost: closed
}

// exampleTB stands in for a test's t in Example, which has none: New uses
// only Helper, Cleanup and Fatalf.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (t *exampleTB) Helper()                           {}
func (t *exampleTB) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (t *exampleTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
