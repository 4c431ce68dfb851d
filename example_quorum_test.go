package netlock_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// With several Backends, each an independent Redis deployment, New makes a
// quorum lock: it is held when a majority of them grant it with the same
// fencing token, so it survives the loss of a minority. Here one of three
// servers is down.
func ExampleNew_quorum() {
	var servers []*miniredis.Miniredis
	var backends []netlock.Backend
	for range 3 {
		srv := miniredis.NewMiniRedis() // three independent servers in production
		if err := srv.Start(); err != nil {
			panic(err)
		}
		defer srv.Close()
		pool := newPool(srv.Addr())
		defer pool.Close()
		servers = append(servers, srv)
		backends = append(backends, netlock.NewRedigo(pool))
	}
	servers[2].Close() // one deployment down

	mu, err := netlock.New("payout:42", backends)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := mu.LockCtx(ctx); err != nil {
		panic(err)
	}
	fmt.Println("locked on a majority, fencing token", mu.Token())

	info, err := netlock.Inspect(ctx, "payout:42", backends)
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", info.Held)
	for i, n := range info.Nodes {
		fmt.Printf("node %d: held %v, answered %v\n", i, n.Held, n.Err == nil)
	}
	if err := mu.UnlockCtx(ctx); err != nil { // released on a majority
		panic(err)
	}
	// Output:
	// locked on a majority, fencing token 1
	// held: true
	// node 0: held true, answered true
	// node 1: held true, answered true
	// node 2: held false, answered false
}
