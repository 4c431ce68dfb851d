package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	redsyncredigo "github.com/go-redsync/redsync/v4/redis/redigo"
	redsyncrueidis "github.com/go-redsync/redsync/v4/redis/rueidis"
	"github.com/gomodule/redigo/redis"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidiscompat"
	"github.com/redis/rueidis/rueidislock"

	"github.com/netlock-go/netlock"
	netlockgoredis "github.com/netlock-go/netlock/goredis"
)

// A contender is one library with one client adapter and one set of options.
type contender struct {
	name string
	// role is what the summary compares it as.
	role role
	// module is the Go module whose version the report gives.
	module string
	// config says how it is set up, for the report.
	config string
	// sharing says how goroutines share it in the shared-lock scenario.
	sharing string
	// noQuorum is why it cannot lock over several independent servers; empty
	// if it can.
	noQuorum string
	// waits says how it waits in the waiting scenario: the options, and how
	// its holder keeps the lock past the key's expiry.
	waits string
	// noWait is why it cannot wait (it makes one attempt); empty if it can.
	noWait string
	// waitingOnly marks an option set that only the waiting scenario needs.
	waitingOnly bool
	// connect makes one client, as one process would have: its own
	// connections to every address (one address: a plain lock; several: a
	// quorum).
	connect func(addrs []string) (client, error)
	// connectCluster, if set, makes one client of a Redis Cluster whose
	// masters are addrs, as one process would have: a cluster client.
	connectCluster func(addrs []string) (client, error)
}

type role int

const (
	roleNetlock   role = iota // the library under test
	rolePeer                  // another lock library
	roleReference             // a hand-written floor, not a library
)

// A client is one process's connection to the lock service.
type client interface {
	// locker returns a lock object for the lock called name.
	locker(name string) (locker, error)
	// shared reports whether one lock object may be used by many goroutines
	// at once; if not, goroutines of one process each take their own from
	// the shared client.
	shared() bool
	close()
}

// A locker is a lock object.
type locker interface {
	// lock waits for the lock until it is held or ctx ends, and returns the
	// function that releases this hold. An attempt that gave up because the
	// lock is held elsewhere returns an error wrapping errBusy.
	lock(ctx context.Context) (unlock func(context.Context) error, err error)
}

// An extendable locker's library does not extend a hold by itself.
// lockExtendable is lock that also returns extend, which pushes the hold's
// expiry out to a full lockExpiry again.
type extendable interface {
	lockExtendable(ctx context.Context) (unlock, extend func(context.Context) error, err error)
}

// errBusy marks an attempt that ended while the lock was held elsewhere: the
// library gave up (retries exhausted) or does not wait (no retry).
var errBusy = errors.New("held elsewhere, gave up")

// Client settings, the same for every library that has them: enough pooled
// connections for 64 goroutines, so that no pool is the bottleneck.
const (
	poolSize   = 128
	lockExpiry = 8 * time.Second // netlock's and redsync's default
	ioTimeout  = 5 * time.Second
)

func contenders() []contender {
	redsyncTuned := []redsync.Option{redsync.WithRetryDelay(time.Millisecond), redsync.WithTries(math.MaxInt32)}
	return []contender{
		{
			name: "hand-written/redigo", role: roleReference, module: "github.com/gomodule/redigo",
			config:   "SET NX PX, then EVALSHA compare-and-delete; one pooled connection per command (GetContext, then Do)",
			noQuorum: "a floor for one server only",
			connect: func(addrs []string) (client, error) {
				return &handRedigo{pool: newRedigoPool(addrs[0])}, nil
			},
		},
		{
			name: "hand-written/goredis", role: roleReference, module: "github.com/redis/go-redis/v9",
			config:   "SET NX with an 8 s TTL (SetArgs), then EVALSHA compare-and-delete (redis.Script.Run)",
			noQuorum: "a floor for one server only",
			connect: func(addrs []string) (client, error) {
				return &handGoredis{c: newGoredis(addrs[0])}, nil
			},
		},
		{
			name: "hand-written/rueidis", role: roleReference, module: "github.com/redis/rueidis",
			config:   "SET NX PX, then EVALSHA compare-and-delete (rueidis.Lua)",
			noQuorum: "a floor for one server only",
			connect: func(addrs []string) (client, error) {
				c, err := newRueidis(addrs[0])
				if err != nil {
					return nil, err
				}
				return &handRueidis{c: c}, nil
			},
		},
		{
			name: "netlock/redigo", role: roleNetlock, module: "github.com/netlock-go/netlock",
			config:  "netlock.New(name, NewRedigo(pool)...), default options",
			sharing: "one *NetMutex shared by all goroutines",
			waits:   netlockWaits,
			connect: func(addrs []string) (client, error) {
				c := &netlockClient{}
				for _, a := range addrs {
					p := newRedigoPool(a)
					c.backends = append(c.backends, netlock.NewRedigo(p))
					c.closers = append(c.closers, func() { p.Close() })
				}
				return c, nil
			},
		},
		{
			name: "netlock/goredis", role: roleNetlock, module: "github.com/netlock-go/netlock",
			config:  "netlock.New(name, goredis.New(client)...), default options; the client as the others' but with ContextTimeoutEnabled, as netlock/goredis advises",
			sharing: "one *NetMutex shared by all goroutines",
			waits:   netlockWaits,
			connect: func(addrs []string) (client, error) {
				c := &netlockClient{}
				for _, a := range addrs {
					r := newGoredisBounded(a)
					c.backends = append(c.backends, netlockgoredis.New(r))
					c.closers = append(c.closers, func() { r.Close() })
				}
				return c, nil
			},
			connectCluster: func(addrs []string) (client, error) {
				r := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, PoolSize: poolSize, ContextTimeoutEnabled: true})
				return &netlockClient{backends: []netlock.Backend{netlockgoredis.New(r)}, closers: []func(){func() { r.Close() }}}, nil
			},
		},
		{
			name: "netlock/rueidis", role: roleNetlock, module: "github.com/netlock-go/netlock",
			config:  "netlock.New(name, NewRueidis(client)...), default options",
			sharing: "one *NetMutex shared by all goroutines",
			waits:   netlockWaits,
			connect: func(addrs []string) (client, error) {
				c := &netlockClient{}
				for _, a := range addrs {
					r, err := newRueidis(a)
					if err != nil {
						c.close()
						return nil, err
					}
					c.backends = append(c.backends, netlock.NewRueidis(r))
					c.closers = append(c.closers, r.Close)
				}
				return c, nil
			},
			connectCluster: func(addrs []string) (client, error) {
				r, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs})
				if err != nil {
					return nil, err
				}
				return &netlockClient{backends: []netlock.Backend{netlock.NewRueidis(r)}, closers: []func(){r.Close}}, nil
			},
		},
		redsyncContender("redsync/redigo", "defaults (32 tries, 50–250 ms between)", nil, redsyncRedigoPool),
		redsyncContender("redsync/redigo tuned", "WithRetryDelay(1ms), WithTries(MaxInt32)", redsyncTuned, redsyncRedigoPool),
		redsyncContender("redsync/goredis", "defaults (32 tries, 50–250 ms between)", nil, redsyncGoredisPool),
		redsyncContender("redsync/goredis tuned", "WithRetryDelay(1ms), WithTries(MaxInt32)", redsyncTuned, redsyncGoredisPool),
		redsyncContender("redsync/rueidis", "defaults (32 tries, 50–250 ms between)", nil, redsyncRueidisPool),
		redsyncContender("redsync/rueidis tuned", "WithRetryDelay(1ms), WithTries(MaxInt32)", redsyncTuned, redsyncRueidisPool),
		bsmNoWait(bsmContender("redislock no-retry", "Obtain with NoRetry (the default); a waiting caller calls it again at once", redislock.NoRetry())),
		bsmContender("redislock linear-1ms", "Obtain with LinearBackoff(1ms), bounded by the run's deadline", redislock.LinearBackoff(time.Millisecond)),
		bsmWaitingOnly(bsmContender("redislock linear-100ms", "Obtain with LinearBackoff(100ms), bounded by the run's deadline", redislock.LinearBackoff(100*time.Millisecond))),
		rueidislockContender("rueidislock", "NewLocker defaults (KeyMajority 2: 3 keys, client-side-caching wake-up), WithContext", false),
		rueidislockContender("rueidislock noloop", "NewLocker with NoLoopTracking (as its README advises for Redis ≥ 7.0.5), otherwise defaults, WithContext (waiting scenario only)", true),
	}
}

// Clients of each Redis library, set up the same way for every contender.

func newRedigoPool(addr string) *redis.Pool {
	return &redis.Pool{
		MaxIdle: poolSize,
		Dial: func() (redis.Conn, error) {
			return redis.Dial("tcp", addr,
				redis.DialConnectTimeout(ioTimeout),
				redis.DialReadTimeout(ioTimeout),
				redis.DialWriteTimeout(ioTimeout))
		},
	}
}

func newGoredis(addr string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: poolSize})
}

// newGoredisBounded is newGoredis with ContextTimeoutEnabled, which
// netlock/goredis asks for: a context's deadline bounds the socket I/O of
// each command (without it, each netlock call would run on a goroutine of
// its own to return by its deadline).
func newGoredisBounded(addr string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: poolSize, ContextTimeoutEnabled: true})
}

func newRueidis(addr string) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
}

// netlock

type netlockClient struct {
	backends []netlock.Backend
	closers  []func()
}

func (c *netlockClient) locker(name string) (locker, error) {
	m, err := netlock.New(name, c.backends)
	if err != nil {
		return nil, err
	}
	return netlockLocker{m}, nil
}

func (c *netlockClient) shared() bool { return true } // like sync.Mutex

func (c *netlockClient) close() {
	for _, f := range c.closers {
		f()
	}
}

const netlockWaits = "LockCtx, default options; the holder's watchdog extends its key (every third of the 8 s expiry)"

type netlockLocker struct{ m *netlock.NetMutex }

func (l netlockLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	if err := l.m.LockCtx(ctx); err != nil {
		return nil, err
	}
	return l.m.UnlockCtx, nil
}

// redsync

func redsyncContender(name, config string, opts []redsync.Option, pool func(string) (pooled, error)) contender {
	return contender{
		name: name, role: rolePeer, module: "github.com/go-redsync/redsync/v4",
		config:  config,
		sharing: "one *redsync.Mutex per goroutine (not safe for concurrent use) on one shared Redsync",
		waits:   redsyncWaits(opts),
		connect: func(addrs []string) (client, error) {
			c := &redsyncClient{opts: opts}
			var pools []redsyncredis.Pool
			for _, a := range addrs {
				p, err := pool(a)
				if err != nil {
					c.close()
					return nil, err
				}
				pools = append(pools, p.pool)
				c.closers = append(c.closers, p.close)
			}
			c.rs = redsync.New(pools...)
			return c, nil
		},
	}
}

// redsyncWaits says how a redsync contender waits in the waiting scenario.
func redsyncWaits(opts []redsync.Option) string {
	how := "LockContext with WithRetryDelay(1ms), WithTries(MaxInt32)"
	if opts == nil {
		how = "LockContext, defaults: 32 tries 50–250 ms apart, then it gives up and the waiter calls it again at once (gave up)"
	}
	return how + fmt.Sprintf("; the holder calls ExtendContext every %.1f s (redsync does not extend by itself)", extendEvery.Seconds())
}

type pooled struct {
	pool  redsyncredis.Pool
	close func()
}

func redsyncRedigoPool(addr string) (pooled, error) {
	p := newRedigoPool(addr)
	return pooled{redsyncredigo.NewPool(p), func() { p.Close() }}, nil
}

func redsyncGoredisPool(addr string) (pooled, error) {
	c := newGoredis(addr)
	return pooled{redsyncgoredis.NewPool(c), func() { c.Close() }}, nil
}

func redsyncRueidisPool(addr string) (pooled, error) {
	c, err := newRueidis(addr)
	if err != nil {
		return pooled{}, err
	}
	return pooled{redsyncrueidis.NewPool(rueidiscompat.NewAdapter(c)), c.Close}, nil
}

type redsyncClient struct {
	rs      *redsync.Redsync
	opts    []redsync.Option
	closers []func()
}

func (c *redsyncClient) locker(name string) (locker, error) {
	return redsyncLocker{c.rs.NewMutex(name, c.opts...)}, nil
}

// shared is false: a redsync.Mutex keeps the value of its current hold in
// unguarded fields.
func (c *redsyncClient) shared() bool { return false }

func (c *redsyncClient) close() {
	for _, f := range c.closers {
		f()
	}
}

type redsyncLocker struct{ m *redsync.Mutex }

func (l redsyncLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	unlock, _, err := l.lockExtendable(ctx)
	return unlock, err
}

func (l redsyncLocker) lockExtendable(ctx context.Context) (unlock, extend func(context.Context) error, err error) {
	if err := l.m.LockContext(ctx); err != nil {
		var taken *redsync.ErrTaken
		var nodeTaken *redsync.ErrNodeTaken
		if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) || errors.As(err, &nodeTaken) {
			return nil, nil, fmt.Errorf("%w: %v", errBusy, err)
		}
		return nil, nil, err
	}
	unlock = func(ctx context.Context) error {
		ok, err := l.m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: unlock reported not released")
		}
		return err
	}
	extend = func(ctx context.Context) error {
		ok, err := l.m.ExtendContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: extend reported not extended")
		}
		return err
	}
	return unlock, extend, nil
}

// bsm/redislock

func bsmContender(name, config string, retry redislock.RetryStrategy) contender {
	return contender{
		name: name, role: rolePeer, module: "github.com/bsm/redislock",
		config:   config + "; go-redis v9 client",
		sharing:  "one redislock.Client shared; every Obtain returns a *Lock of its own",
		noQuorum: "locks on one Redis client only",
		waits:    config + fmt.Sprintf("; the holder calls Refresh every %.1f s (redislock does not extend by itself)", extendEvery.Seconds()),
		connect: func(addrs []string) (client, error) {
			rdb := newGoredis(addrs[0])
			return &bsmClient{rdb: rdb, c: redislock.New(rdb), retry: retry}, nil
		},
	}
}

// bsmNoWait marks a redislock contender that makes one attempt only.
func bsmNoWait(c contender) contender {
	c.noWait = "NoRetry makes one attempt; redislock's waiting is measured with the linear-backoff rows"
	return c
}

// bsmWaitingOnly marks a redislock contender for the waiting scenario only:
// redislock has no default retry, and a 100 ms one is what a caller that
// waits might pick (the other scenarios have the 1 ms one).
func bsmWaitingOnly(c contender) contender {
	c.waitingOnly = true
	c.config += " (waiting scenario only)"
	return c
}

type bsmClient struct {
	rdb   *goredis.Client
	c     *redislock.Client
	retry redislock.RetryStrategy // both strategies used here are stateless
}

func (c *bsmClient) locker(name string) (locker, error) {
	return bsmLocker{c: c, key: name}, nil
}

// shared is true: a redislock.Client is safe for concurrent use and every
// Obtain returns a Lock of its own.
func (c *bsmClient) shared() bool { return true }

func (c *bsmClient) close() { c.rdb.Close() }

type bsmLocker struct {
	c   *bsmClient
	key string
}

func (l bsmLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	unlock, _, err := l.lockExtendable(ctx)
	return unlock, err
}

func (l bsmLocker) lockExtendable(ctx context.Context) (unlock, extend func(context.Context) error, err error) {
	lk, err := l.c.c.Obtain(ctx, l.key, lockExpiry, &redislock.Options{RetryStrategy: l.c.retry})
	if errors.Is(err, redislock.ErrNotObtained) {
		return nil, nil, fmt.Errorf("%w: %v", errBusy, err)
	}
	if err != nil {
		return nil, nil, err
	}
	extend = func(ctx context.Context) error { return lk.Refresh(ctx, lockExpiry, nil) }
	return lk.Release, extend, nil
}

// rueidislock

// rueidislockContender: with noLoop, the waiting scenario's row only. By
// default, a holder's Locker is told of its own extends (no NOLOOP) and
// extends again on each, from its first extend on, as fast as Redis answers;
// every waiter wakes on each of them. Only a hold past the first extend
// (half the validity) shows it, which only the waiting scenario has.
func rueidislockContender(name, config string, noLoop bool) contender {
	waits := "WithContext, defaults: a waiter tries again whenever client-side caching invalidates one of the keys; " +
		"the holder's Locker extends its keys itself every 2.5 s (half of their 5 s validity), and, told of its own extends (no NOLOOP), again on each from the first on"
	if noLoop {
		waits = "WithContext with NoLoopTracking: a waiter tries again whenever client-side caching invalidates one of the keys, as each extend does; " +
			"the holder's Locker extends its keys itself every 2.5 s (half of their 5 s validity)"
	}
	return contender{
		name: name, role: rolePeer, module: "github.com/redis/rueidis",
		config:      config,
		sharing:     "one Locker shared (safe for concurrent use)",
		noQuorum:    "its majority is over keys in one deployment, not over independent servers",
		waits:       waits,
		waitingOnly: noLoop,
		connect: func(addrs []string) (client, error) {
			l, err := rueidislock.NewLocker(rueidislock.LockerOption{
				ClientOption:   rueidis.ClientOption{InitAddress: []string{addrs[0]}},
				NoLoopTracking: noLoop,
			})
			if err != nil {
				return nil, err
			}
			return &rueidislockClient{l: l}, nil
		},
	}
}

type rueidislockClient struct{ l rueidislock.Locker }

func (c *rueidislockClient) locker(name string) (locker, error) {
	return rueidislockLocker{l: c.l, name: name}, nil
}

// shared is true: a rueidislock.Locker is safe for concurrent use, and
// goroutines waiting for one name share its wake-up gate.
func (c *rueidislockClient) shared() bool { return true }

func (c *rueidislockClient) close() { c.l.Close() }

type rueidislockLocker struct {
	l    rueidislock.Locker
	name string
}

func (l rueidislockLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	_, cancel, err := l.l.WithContext(ctx, l.name)
	if err != nil {
		return nil, err
	}
	return func(context.Context) error { cancel(); return nil }, nil
}

// The hand-written floor: SET key value NX PX, then a compare-and-delete
// script, and nothing else. It does not wait: a held key is errBusy.

const compareAndDelete = `if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end`

var (
	compareAndDeleteScript = redis.NewScript(1, compareAndDelete)
	compareAndDeleteLua    = rueidis.NewLuaScript(compareAndDelete)
	expiryMS               = lockExpiry.Milliseconds()
)

func randomValue() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

var errNotReleased = errors.New("compare-and-delete found another value")

type handRedigo struct{ pool *redis.Pool }

func (c *handRedigo) locker(name string) (locker, error) { return handRedigoLocker{c.pool, name}, nil }
func (c *handRedigo) shared() bool                       { return true }
func (c *handRedigo) close()                             { c.pool.Close() }

type handRedigoLocker struct {
	pool *redis.Pool
	key  string
}

func (l handRedigoLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	value := randomValue()
	err := l.do(ctx, func(conn redis.Conn) error {
		_, err := redis.String(conn.Do("SET", l.key, value, "NX", "PX", expiryMS))
		return err
	})
	if errors.Is(err, redis.ErrNil) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return l.do(ctx, func(conn redis.Conn) error {
			// Script.Do sends EVALSHA and falls back to EVAL on NOSCRIPT.
			n, err := redis.Int(compareAndDeleteScript.Do(conn, l.key, value))
			if err == nil && n != 1 {
				err = errNotReleased
			}
			return err
		})
	}, nil
}

// do runs f on a pooled connection. The commands use Do, not DoContext,
// which in redigo v1.9 starts a goroutine per command to watch ctx: ctx
// bounds taking the connection, the dial's read timeout bounds the reply.
func (l handRedigoLocker) do(ctx context.Context, f func(redis.Conn) error) error {
	conn, err := l.pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(conn)
}

type handRueidis struct{ c rueidis.Client }

func (c *handRueidis) locker(name string) (locker, error) { return handRueidisLocker{c.c, name}, nil }
func (c *handRueidis) shared() bool                       { return true }
func (c *handRueidis) close()                             { c.c.Close() }

type handRueidisLocker struct {
	c   rueidis.Client
	key string
}

func (l handRueidisLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	value := randomValue()
	err := l.c.Do(ctx, l.c.B().Set().Key(l.key).Value(value).Nx().PxMilliseconds(expiryMS).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		// Lua.Exec sends EVALSHA and falls back to EVAL on NOSCRIPT.
		n, err := compareAndDeleteLua.Exec(ctx, l.c, []string{l.key}, []string{value}).AsInt64()
		if err == nil && n != 1 {
			err = errNotReleased
		}
		return err
	}, nil
}

type handGoredis struct{ c *goredis.Client }

func (c *handGoredis) locker(name string) (locker, error) { return handGoredisLocker{c.c, name}, nil }
func (c *handGoredis) shared() bool                       { return true }
func (c *handGoredis) close()                             { c.c.Close() }

type handGoredisLocker struct {
	c   *goredis.Client
	key string
}

var compareAndDeleteGoredis = goredis.NewScript(compareAndDelete)

func (l handGoredisLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	value := randomValue()
	err := l.c.SetArgs(ctx, l.key, value, goredis.SetArgs{Mode: "NX", TTL: lockExpiry}).Err()
	if errors.Is(err, goredis.Nil) {
		return nil, errBusy
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		// Script.Run sends EVALSHA and falls back to EVAL on NOSCRIPT.
		n, err := compareAndDeleteGoredis.Run(ctx, l.c, []string{l.key}, value).Int64()
		if err == nil && n != 1 {
			err = errNotReleased
		}
		return err
	}, nil
}

// pingers: the round-trip floor of each client library.

type pinger func(ctx context.Context) error

func redigoPinger(pool *redis.Pool) pinger {
	return func(ctx context.Context) error {
		conn, err := pool.GetContext(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Do("PING") // as the hand-written cycle: see handRedigoLocker.do
		return err
	}
}

func goredisPinger(c *goredis.Client) pinger {
	return func(ctx context.Context) error { return c.Ping(ctx).Err() }
}

func rueidisPinger(c rueidis.Client) pinger {
	return func(ctx context.Context) error {
		return c.Do(ctx, c.B().Ping().Build()).Error()
	}
}
