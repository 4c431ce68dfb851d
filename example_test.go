package netlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
)

// newPool returns a redigo pool on addr. In production this is your own
// pool, shared by all the locks of a process.
func newPool(addr string) *redis.Pool {
	return &redis.Pool{
		MaxIdle: 8,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr)
		},
	}
}

// A NetMutex replaces a sync.Mutex: the same Lock and Unlock, now excluding
// every process that uses the same lock name.
func Example() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()

	var mu sync.Locker
	mu, err := netlock.New("counter", []netlock.Backend{netlock.NewRedigo(pool)})
	if err != nil {
		panic(err)
	}

	count := 0
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			mu.Lock()
			count++ // check, then act: safe across processes
			mu.Unlock()
		})
	}
	wg.Wait()
	fmt.Println("count:", count)
	// Output: count: 10
}

// LockCtx waits for the lock until the context ends, and then says why it
// gave up.
func ExampleNetMutex_LockCtx() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()
	backends := []netlock.Backend{netlock.NewRedigo(pool)}

	holder, _ := netlock.New("report", backends)
	waiter, _ := netlock.New("report", backends) // as in another process
	holder.Lock()
	defer holder.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := waiter.LockCtx(ctx)
	fmt.Println(errors.Is(err, netlock.ErrNotObtained), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

// TryLock makes one attempt, like sync.Mutex.TryLock: a job skips its turn
// while another host holds the lock.
func ExampleNetMutex_TryLock() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()
	backends := []netlock.Backend{netlock.NewRedigo(pool)}

	hostA, _ := netlock.New("nightly-report", backends)
	hostB, _ := netlock.New("nightly-report", backends)

	fmt.Println("host A runs:", hostA.TryLock())
	fmt.Println("host B runs:", hostB.TryLock())
	hostA.Unlock()
	// Output:
	// host A runs: true
	// host B runs: false
}

// Do runs a function under the lock and unlocks afterwards, even if the
// function panics. Its context is cancelled if the hold is lost.
func ExampleDo() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()

	mu, _ := netlock.New("quiz:match-7", []netlock.Backend{netlock.NewRedigo(pool)})
	question, err := netlock.Do(context.Background(), mu, func(ctx context.Context) (string, error) {
		// Pick the next question once per match, whichever replica asks.
		return "What is the capital of Norway?", nil
	})
	fmt.Println(question, err)
	// Output: What is the capital of Norway? <nil>
}

// A fenced resource accepts a write only with a token at least as high as
// the highest it has seen. A holder that paused past its expiry (a long GC,
// a stopped VM) wakes up still believing it holds the lock; its stale token
// gives it away.
func ExampleNetMutex_Token() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := newPool(srv.Addr())
	defer pool.Close()
	backends := []netlock.Backend{netlock.NewRedigo(pool)}

	storage := &fencedStorage{}
	a, _ := netlock.New("invoice-42", backends, netlock.WithExpiry(time.Second), netlock.WithAutoExtend(false))
	b, _ := netlock.New("invoice-42", backends)

	a.Lock()
	tokenA := a.Token()
	srv.FastForward(2 * time.Second) // a pauses past its expiry

	b.Lock() // b takes over and writes
	fmt.Println("b writes:", storage.write(b.Token(), "paid by b"))
	b.Unlock()

	// a wakes up and writes with its old token.
	fmt.Println("a writes:", storage.write(tokenA, "paid by a"))
	fmt.Println("a's extend:", a.ExtendCtx(context.Background()))
	fmt.Println("a's unlock:", a.UnlockCtx(context.Background()))
	fmt.Println("stored:", storage.value)
	// Output:
	// b writes: <nil>
	// a writes: stale token 1, already saw 2
	// a's extend: netlock: lock lost
	// a's unlock: netlock: lock lost
	// stored: paid by b
}

// fencedStorage stands for a database row or a file store that checks
// fencing tokens.
type fencedStorage struct {
	mu      sync.Mutex
	highest uint64
	value   string
}

func (s *fencedStorage) write(token uint64, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return fmt.Errorf("stale token %d, already saw %d", token, s.highest)
	}
	s.highest, s.value = token, value
	return nil
}
