package netlock_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// Inspect tells whether a lock is held, by whom, by which hold and for how
// long, without taking it or a place in its queue: what "netlock status"
// shows. The holder's identity is "<hostname>/<pid>" of its process unless
// it sets one with WithHolderInfo.
func ExampleInspect() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()
	backends := []netlock.Backend{netlock.NewRedigo(pool)}
	ctx := context.Background()

	holder, _ := netlock.New("nightly-report", backends, netlock.WithHolderInfo("report-job-7")) // as in another process
	holder.Lock()

	info, err := netlock.Inspect(ctx, "nightly-report", backends)
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", info.Held, "by:", info.HolderInfo, "token:", info.Token, "expires:", info.TTL > 0)
	node := info.Nodes[0]
	fmt.Println("node 0: held:", node.Held, "waiters:", node.Waiters, "fence counter:", node.FenceCounter)

	holder.Unlock()
	info, err = netlock.Inspect(ctx, "nightly-report", backends)
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", info.Held)
	// Output:
	// held: true by: report-job-7 token: 1 expires: true
	// node 0: held: true waiters: 0 fence counter: 1
	// held: false
}
