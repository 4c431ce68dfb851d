package netlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
)

// myBackend is a Backend of your own, here on redigo connections (for
// redigo itself, use NewRedigo). Eval is all a lock needs; Hub makes its
// waiters wait by message and Final tells the reaper which errors are final.
type myBackend struct {
	addr     string
	pool     *redis.Pool
	hub      *netlock.Hub
	acquires atomic.Int64 // acquire script calls answered
}

func newMyBackend(addr string) *myBackend {
	b := &myBackend{addr: addr, pool: newPool(addr)}
	b.hub = netlock.NewHub(netlock.HubConfig{Listen: b.listen})
	return b
}

func (b *myBackend) Eval(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	if s.Name() == "acquire" {
		defer b.acquires.Add(1)
	}
	conn, err := b.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	argv := []any{s.SHA1(), len(keys)}
	for _, k := range keys {
		argv = append(argv, k)
	}
	for _, a := range args {
		argv = append(argv, a)
	}
	reply, err := redis.Int64s(redis.DoContext(conn, ctx, "EVALSHA", argv...))
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		argv[0] = s.Source()
		reply, err = redis.Int64s(redis.DoContext(conn, ctx, "EVAL", argv...))
	}
	return reply, err
}

func (b *myBackend) Hub() *netlock.Hub { return b.hub }

func (b *myBackend) Final(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// listen dials a connection of its own for pub/sub; the Hub shares it
// among all the waiters of this Backend.
func (b *myBackend) listen(ctx context.Context, onMessage func(channel, payload string)) (netlock.Listener, error) {
	conn, err := redis.DialContext(ctx, "tcp", b.addr)
	if err != nil {
		return nil, err
	}
	return &myListener{psc: redis.PubSubConn{Conn: conn}, onMessage: onMessage}, nil
}

type myListener struct {
	psc       redis.PubSubConn
	onMessage func(channel, payload string)
}

func (l *myListener) Subscribe(_ context.Context, channel string) error {
	return l.psc.Subscribe(channel)
}

func (l *myListener) Unsubscribe(_ context.Context, channel string) error {
	return l.psc.Unsubscribe(channel)
}

func (l *myListener) Confirmed() (string, error) {
	for {
		switch v := l.psc.Receive().(type) {
		case redis.Message:
			l.onMessage(v.Channel, string(v.Data))
		case redis.Subscription:
			if v.Kind == "subscribe" {
				return v.Channel, nil
			}
		case error:
			return "", v
		}
	}
}

func (l *myListener) Close() { l.psc.Close() }

// A Backend of your own that implements Subscriber waits like the built-in
// ones: the waiter attempts twice (finding the lock held, then joining the
// queue once it listens) and is then granted the lock by the holder's
// release, by message, without asking again.
func ExampleSubscriber() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	holderB, waiterB := newMyBackend(srv.Addr()), newMyBackend(srv.Addr())
	defer holderB.pool.Close()
	defer waiterB.pool.Close()

	holder, err := netlock.New("report", []netlock.Backend{holderB})
	if err != nil {
		panic(err)
	}
	waiter, err := netlock.New("report", []netlock.Backend{waiterB})
	if err != nil {
		panic(err)
	}

	holder.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		waiter.Lock()
		fmt.Println("waiter holds token", waiter.Token())
		waiter.Unlock()
	}()
	for waiterB.acquires.Load() < 2 { // until the waiter is queued
		time.Sleep(time.Millisecond)
	}
	holder.Unlock()
	<-done
	fmt.Println("waiter's acquire calls:", waiterB.acquires.Load())
	// Output:
	// waiter holds token 2
	// waiter's acquire calls: 2
}
