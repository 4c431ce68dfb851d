package netlock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// An Observer is told of every acquire, unlock, extend and lost hold, for
// metrics and traces; netlock/otelnetlock makes one that records
// OpenTelemetry instruments and spans. Here its functions print what they
// are told.
func ExampleWithObserver() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()
	backends := []netlock.Backend{netlock.NewRedigo(pool)}

	obs := netlock.Observer{
		Acquire: func(ctx context.Context, a netlock.AcquireStart) (context.Context, func(netlock.AcquireDone)) {
			return ctx, func(d netlock.AcquireDone) {
				fmt.Printf("acquire %s: acquired %v, contended %v, token %d\n", d.Name, d.Acquired, d.Contended, d.Token)
			}
		},
		Unlock: func(ctx context.Context, u netlock.UnlockDone) {
			fmt.Printf("unlock %s: token %d, err %v\n", u.Name, u.Token, u.Err)
		},
		Lost: func(l netlock.LostHold) {
			fmt.Printf("lost %s: token %d, found at %s\n", l.Name, l.Token, l.Reason)
		},
	}
	mu, err := netlock.New("orders", backends, netlock.WithObserver(obs),
		netlock.WithExpiry(time.Second), netlock.WithAutoExtend(false))
	if err != nil {
		panic(err)
	}
	other, _ := netlock.New("orders", backends) // as in another process

	mu.Lock()
	mu.Unlock()

	other.Lock()
	mu.TryLock() // held elsewhere: not acquired, contended
	other.Unlock()

	mu.Lock()
	srv.FastForward(2 * time.Second) // the key expires in Redis while mu holds it
	mu.UnlockCtx(context.Background())
	// Output:
	// acquire orders: acquired true, contended false, token 1
	// unlock orders: token 1, err <nil>
	// acquire orders: acquired false, contended true, token 0
	// acquire orders: acquired true, contended false, token 3
	// lost orders: token 3, found at release
	// unlock orders: token 3, err netlock: lock lost
}
