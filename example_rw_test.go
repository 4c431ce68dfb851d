package netlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock"
)

// A NetRWMutex replaces a sync.RWMutex: any number of readers, in every
// process, or one writer. Here a config snapshot is read by many goroutines
// and rebuilt by one; the readers of a process share one lease in Redis.
func ExampleNetRWMutex() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()

	rw, err := netlock.NewRW("config", []netlock.Backend{netlock.NewRedigo(pool)})
	if err != nil {
		panic(err)
	}

	config := map[string]string{"mode": "old"}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			rw.RLock()
			_ = config["mode"] // readers run together
			rw.RUnlock()
		})
	}
	wg.Wait()

	rw.Lock() // waits for every reader, of every process
	config["mode"] = "new"
	token := rw.Token() // the writer's fencing token
	rw.Unlock()

	rw.RLock()
	fmt.Println(config["mode"], token > 0)
	rw.RUnlock()
	// Output: new true
}

// RLockCtx bounds the wait of a reader; RLost says when the process's read
// lease ended without its say, so a long read can stop.
func ExampleNetRWMutex_RLockCtx() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()
	backends := []netlock.Backend{netlock.NewRedigo(pool)}

	writer, _ := netlock.NewRW("report", backends)
	reader, _ := netlock.NewRW("report", backends) // as another process would
	writer.Lock()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := reader.RLockCtx(ctx)
	fmt.Println("while a writer holds:", errors.Is(err, netlock.ErrNotObtained), errors.Is(err, context.DeadlineExceeded))
	writer.Unlock()

	if err := reader.RLockCtx(context.Background()); err != nil {
		panic(err)
	}
	select {
	case <-reader.RLost():
		fmt.Println("lease lost")
	default:
		fmt.Println("reading")
	}
	reader.RUnlock()
	// Output:
	// while a writer holds: true true
	// reading
}
