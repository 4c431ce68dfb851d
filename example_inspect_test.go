package netlock_test

import (
	"context"
	"fmt"
	"slices"

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

// A NetRWMutex's Inspect tells whether a writer holds it, and which
// processes' read leases hold it, by the identity each wrote
// (WithHolderInfo), without taking it or a place in its queues.
func ExampleNetRWMutex_Inspect() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()
	backends := []netlock.Backend{netlock.NewRedigo(pool)}
	ctx := context.Background()

	// Two readers, as in two other processes.
	for _, who := range []string{"reader-a", "reader-b"} {
		r, _ := netlock.NewRW("catalog", backends, netlock.WithHolderInfo(who))
		r.RLock()
		defer r.RUnlock()
	}

	rw, _ := netlock.NewRW("catalog", backends)
	info, err := rw.Inspect(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("writer:", info.Held, "read leases:", len(info.Readers))
	var holders []string
	for _, l := range info.Readers {
		holders = append(holders, l.HolderInfo)
	}
	slices.Sort(holders)
	fmt.Println("readers:", holders)
	// Output:
	// writer: false read leases: 2
	// readers: [reader-a reader-b]
}
