package netlock_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// An Election picks one leader among the replicas of a service: each
// replica campaigns with its address, the first one leads, the next waits
// in line. Every replica can follow who leads with Observe; the term is a
// fencing token that grows with every new leader.
func ExampleElection() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx := context.Background()

	var replicas []*netlock.Election
	for range 2 { // each replica with a Redis client of its own
		pool := newPool(srv.Addr())
		defer pool.Close()
		e, err := netlock.NewElection("scheduler", []netlock.Backend{netlock.NewRedigo(pool)})
		if err != nil {
			panic(err)
		}
		replicas = append(replicas, e)
	}
	a, b := replicas[0], replicas[1]
	defer b.Resign(ctx)

	watch, stop := context.WithCancel(ctx)
	defer stop()
	changes := a.Observe(watch)
	fmt.Printf("leader: %q\n", (<-changes).Value) // nobody yet

	if err := a.Campaign(ctx, "10.0.0.1:8080"); err != nil {
		panic(err)
	}
	first := <-changes
	fmt.Println("leader:", first.Value)

	elected := make(chan error, 1)
	go func() { elected <- b.Campaign(ctx, "10.0.0.2:8080") }() // waits its turn

	if err := a.Proclaim(ctx, "10.0.0.1:9090"); err != nil { // a new value, same term
		panic(err)
	}
	fmt.Println("leader:", (<-changes).Value)

	if err := a.Resign(ctx); err != nil { // b's turn
		panic(err)
	}
	if err := <-elected; err != nil {
		panic(err)
	}
	next := <-changes
	if next.Value == "" { // nobody, for a moment, between the two leaders
		next = <-changes
	}
	fmt.Println("leader:", next.Value, "with a higher term:", next.Term > first.Term)

	l, err := a.Leader(ctx)
	fmt.Println(l.Value, err)
	// Output:
	// leader: ""
	// leader: 10.0.0.1:8080
	// leader: 10.0.0.1:9090
	// leader: 10.0.0.2:8080 with a higher term: true
	// 10.0.0.2:8080 <nil>
}
