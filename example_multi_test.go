package netlock_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// A MultiMutex takes several locks at once, all or nothing: a transfer
// locks both accounts, whatever order the caller names them in, and
// excludes a NetMutex of either account.
func ExampleMultiMutex() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()
	backends := []netlock.Backend{netlock.NewRedigo(pool)}

	transfer, err := netlock.NewMulti([]string{"account:alice", "account:bob"}, backends)
	if err != nil {
		panic(err)
	}
	audit, _ := netlock.New("account:bob", backends) // as in another process

	ctx := context.Background()
	if err := transfer.LockCtx(ctx); err != nil {
		panic(err)
	}
	ok, _ := audit.TryLockCtx(ctx)
	fmt.Println("audit of bob during the transfer:", ok)
	fmt.Println("one token per name:", len(transfer.Tokens()))
	if err := transfer.UnlockCtx(ctx); err != nil {
		panic(err)
	}

	ok, _ = audit.TryLockCtx(ctx)
	fmt.Println("audit of bob after it:", ok)
	audit.Unlock()

	// Another transfer names the accounts the other way round: no deadlock.
	back, _ := netlock.NewMulti([]string{"account:bob", "account:alice"}, backends)
	back.Lock()
	fmt.Println("transfer back:", transfer.TryLock())
	back.Unlock()
	// Output:
	// audit of bob during the transfer: false
	// one token per name: 2
	// audit of bob after it: true
	// transfer back: false
}
