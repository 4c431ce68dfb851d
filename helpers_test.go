package netlock

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/redis/rueidis"
	"pgregory.net/rapid"

	"github.com/netlock-go/netlock/internal/redistest"
)

// Helpers shared by the tests of several files, by what they help with.
// The tests' Backends and Listeners are in fakes_test.go; the client
// libraries the tests run on, in export_test.go.

// Where tests run: a server and a client library.

// env is one place tests run: a server (miniredis or a real redis-server)
// and a client library (one of testClients).
type env struct {
	mini   *miniredis.Miniredis // nil on a real server
	server *redistest.Server    // nil on miniredis
	client string               // one of testClients: "redigo", "rueidis", or a registered one
	addr   string
}

// envKinds selects where forEachEnv runs a test.
type envKinds int

const (
	allEnvs  envKinds = iota // miniredis and real redis-server
	miniOnly                 // tests that move time with FastForward
	realOnly                 // tests that stop or kill the server process
)

// forEachEnv runs fn as a subtest on miniredis and, unless kinds is
// miniOnly, on a real redis-server (realOnly: only there), each with every
// client library of testClients. The real server subtests are skipped when
// redis-server is missing, and fail instead when NETLOCK_REQUIRE_REDIS=1.
func forEachEnv(t *testing.T, kinds envKinds, fn func(t *testing.T, e *env)) {
	t.Helper()
	for _, client := range testClients() {
		if kinds == realOnly {
			break
		}
		t.Run("miniredis/"+client, func(t *testing.T) {
			mini := miniredis.RunT(t)
			fn(t, &env{mini: mini, client: client, addr: mini.Addr()})
		})
	}
	if kinds == miniOnly {
		return
	}
	for _, client := range testClients() {
		t.Run("redis/"+client, func(t *testing.T) {
			s := redistest.Start(t)
			fn(t, &env{server: s, client: client, addr: s.Addr()})
		})
	}
}

// backend returns a Backend on a client of its own, as another process
// would have; the client is closed when the test ends.
func (e *env) backend(t testing.TB) Backend {
	t.Helper()
	return newBackend(t, e.client, e.addr)
}

func newBackend(t testing.TB, client, addr string) Backend {
	t.Helper()
	switch client {
	case "redigo":
		pool := &redis.Pool{
			MaxIdle: 16,
			DialContext: func(ctx context.Context) (redis.Conn, error) {
				return redis.DialContext(ctx, "tcp", addr)
			},
		}
		t.Cleanup(func() { pool.Close() })
		return NewRedigo(pool)
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:  []string{addr},
			DisableCache: true, // netlock never reads through the cache; miniredis has no CLIENT TRACKING
			// miniredis answers CLUSTER SLOTS, so rueidis would take it for
			// a Redis Cluster, whose Backend waits by sharded pub/sub,
			// which miniredis lacks. Every server here is a single one.
			ForceSingleClient: true,
		})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%s): %v", addr, err)
		}
		t.Cleanup(c.Close)
		return NewRueidis(c)
	}
	return openRegistered(t, client, TestClientConfig{Addr: addr})
}

// openRegistered returns a Backend of the registered client library client
// for c, closed when the test ends.
func openRegistered(t testing.TB, client string, c TestClientConfig) Backend {
	t.Helper()
	open := registeredClient(client)
	if open == nil {
		t.Fatalf("unknown client %q", client)
	}
	b, closeClient, err := open(c)
	if err != nil {
		t.Fatalf("%s client on %s: %v", client, c.Addr, err)
	}
	t.Cleanup(closeClient)
	return b
}

// newMutex returns a NetMutex on a backend of its own.
func (e *env) newMutex(t testing.TB, name string, opts ...Option) *NetMutex {
	t.Helper()
	m, err := New(name, []Backend{e.backend(t)}, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return m
}

// do runs one command on the server, for a test to look at or change keys
// behind netlock's back.
func (e *env) do(t testing.TB, args ...any) any {
	t.Helper()
	c, err := redis.Dial("tcp", e.addr, redis.DialReadTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("dial %s: %v", e.addr, err)
	}
	defer c.Close()
	cmd, _ := args[0].(string)
	reply, err := c.Do(cmd, args[1:]...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return reply
}

// exists reports whether key exists on the server.
func (e *env) exists(t testing.TB, key string) bool {
	t.Helper()
	n, _ := redis.Int(e.do(t, "EXISTS", key), nil)
	return n == 1
}

// Locks and waits.

// mustLock locks m with a bound, failing the test rather than hanging.
func mustLock(t testing.TB, m *NetMutex) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.LockCtx(ctx); err != nil {
		t.Fatalf("LockCtx: %v", err)
	}
}

// mustUnlock unlocks m and fails the test on error.
func mustUnlock(t testing.TB, m *NetMutex) {
	t.Helper()
	if err := m.UnlockCtx(context.Background()); err != nil {
		t.Fatalf("UnlockCtx: %v", err)
	}
}

// async calls f in a goroutine, with a context bounded to 10s, and returns
// where its error arrives.
func async(f func(ctx context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- f(ctx)
	}()
	return done
}

// eventually fails the test unless cond holds within d, saying what was
// awaited. It is the tests' one way to wait for something to happen (a
// waiter queued, a message delivered, a key gone): cond is checked at once,
// then after 1ms, 2ms, 4ms… and every 20ms from then on, so a cond that asks
// a server does not flood it, and once more after d. t is a *testing.T, a
// *testing.B or a *rapid.T.
func eventually(t rapid.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(pause) // between checks of cond, not an ordering
	}
}
