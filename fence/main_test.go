package fence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"go.uber.org/goleak"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/goredis"
	"github.com/netlock-go/netlock/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clients are the client libraries netlock adapts; every test runs on each.
var clients = []string{"goredis", "redigo", "rueidis"}

// server is a Redis a test runs on, and the client library the test's
// Backends on it use.
type server struct {
	addr   string
	client string
	mini   *miniredis.Miniredis // nil on a real redis-server
}

// forEachServer runs fn as a subtest on miniredis and on a real
// redis-server, with each client library. The real server's subtests are
// skipped when redis-server is not installed (redistest.Require).
func forEachServer(t *testing.T, fn func(t *testing.T, s server)) {
	t.Helper()
	for _, client := range clients {
		t.Run("miniredis/"+client, func(t *testing.T) {
			mini := miniredis.RunT(t)
			fn(t, server{addr: mini.Addr(), client: client, mini: mini})
		})
	}
	for _, client := range clients {
		t.Run("redis/"+client, func(t *testing.T) {
			fn(t, server{addr: redistest.Start(t).Addr(), client: client})
		})
	}
}

// backend returns a Backend on a client of its own, closed when the test
// ends.
func (s server) backend(t testing.TB) netlock.Backend {
	t.Helper()
	switch s.client {
	case "goredis":
		c := redis.NewClient(&redis.Options{Addr: s.addr})
		t.Cleanup(func() { c.Close() })
		return goredis.New(c)
	case "redigo":
		pool := &redigo.Pool{
			MaxIdle: 4,
			DialContext: func(ctx context.Context) (redigo.Conn, error) {
				return redigo.DialContext(ctx, "tcp", s.addr)
			},
		}
		t.Cleanup(func() { pool.Close() })
		return netlock.NewRedigo(pool)
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:       []string{s.addr},
			DisableCache:      true, // miniredis has no CLIENT TRACKING
			ForceSingleClient: true, // miniredis answers CLUSTER SLOTS
		})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%s): %v", s.addr, err)
		}
		t.Cleanup(c.Close)
		return netlock.NewRueidis(c)
	}
	t.Fatalf("unknown client %q", s.client)
	return nil
}

// do runs one command on the server, to look at or change keys behind
// package fence's back.
func (s server) do(t testing.TB, args ...any) any {
	t.Helper()
	c, err := redigo.Dial("tcp", s.addr, redigo.DialReadTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("dial %s: %v", s.addr, err)
	}
	defer c.Close()
	reply, err := c.Do(args[0].(string), args[1:]...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return reply
}

// fenced returns what key holds: its value field (and whether there is
// one), and its token field, "" when absent.
func (s server) fenced(t testing.TB, key string) (value string, ok bool, token string) {
	t.Helper()
	m, err := redigo.StringMap(s.do(t, "HGETALL", key), nil)
	if err != nil {
		t.Fatalf("HGETALL %s: %v", key, err)
	}
	value, ok = m["v"]
	return value, ok, m["t"]
}

// dump returns everything the server holds at key, for a test to see that
// nothing changed.
func (s server) dump(t testing.TB, key string) string {
	t.Helper()
	kind, _ := redigo.String(s.do(t, "TYPE", key), nil)
	var v any
	switch kind {
	case "string":
		v, _ = redigo.String(s.do(t, "GET", key), nil)
	case "hash":
		v, _ = redigo.StringMap(s.do(t, "HGETALL", key), nil)
	case "list":
		v, _ = redigo.Strings(s.do(t, "LRANGE", key, 0, -1), nil)
	}
	ttl, _ := redigo.Int64(s.do(t, "PTTL", key), nil)
	return fmt.Sprintf("%s %v ttl>0:%v", kind, v, ttl > 0)
}
