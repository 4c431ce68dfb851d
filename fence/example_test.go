package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/fence"
	"github.com/netlock-go/netlock/goredis"
)

// A writer whose hold was lost, and whose lock a later holder has taken,
// is refused at the data: its token is below the one recorded.
func Example() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	b := goredis.New(rdb)
	ctx := context.Background()

	mu, err := netlock.New("invoice-42", []netlock.Backend{b})
	if err != nil {
		panic(err)
	}
	mu.Lock()
	late := mu.Token() // a holder that will write too late
	mu.Unlock()

	mu.Lock()
	if err := fence.Set(ctx, b, "invoice:42", "paid", mu.Token()); err != nil {
		panic(err)
	}
	mu.Unlock()

	err = fence.Set(ctx, b, "invoice:42", "draft", late)
	fmt.Println(errors.Is(err, fence.ErrStale))
	fmt.Println(err)
	fmt.Println(rdb.HGet(ctx, "invoice:42", fence.ValueField).Val())
	// Output:
	// true
	// fence: stale token: set "invoice:42" with token 1: token 2 is recorded; nothing changed
	// paid
}
