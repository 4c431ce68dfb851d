package chaos

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	goredislib "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/goredis"
	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// clients are the client libraries every test here runs with.
var clients = []string{"redigo", "rueidis", "goredis"}

// newBackend returns a Backend on a client of its own for addr, as another
// process would have; the client is closed when the test ends.
func newBackend(t testing.TB, client, addr string) netlock.Backend {
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
		return netlock.NewRedigo(pool)
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:  []string{addr},
			DisableCache: true, // netlock never reads through the cache
		})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%s): %v", addr, err)
		}
		t.Cleanup(c.Close)
		return netlock.NewRueidis(c)
	case "goredis":
		c := goredislib.NewClient(&goredislib.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return goredis.New(c)
	}
	t.Fatalf("unknown client %q", client)
	return nil
}

// startServers starts n independent redis-servers.
func startServers(t *testing.T, n int, args ...string) []*redistest.Server {
	t.Helper()
	servers := make([]*redistest.Server, n)
	for i := range servers {
		servers[i] = redistest.Start(t, args...)
	}
	return servers
}

// lockKey returns the Redis key of lock name under the default prefix,
// from package keyspace, which the library builds its keys with.
func lockKey(name string) string {
	return keyspace.New(netlock.DefaultPrefix, name, true).Lock
}

// mustLock locks m with a bound, failing the test rather than hanging.
func mustLock(t testing.TB, m *netlock.NetMutex) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.LockCtx(ctx); err != nil {
		t.Fatalf("LockCtx: %v", err)
	}
}

// mustUnlock unlocks m and fails the test on error.
func mustUnlock(t testing.TB, m *netlock.NetMutex) {
	t.Helper()
	if err := m.UnlockCtx(context.Background()); err != nil {
		t.Fatalf("UnlockCtx: %v", err)
	}
}

// isOpen reports whether c is not closed.
func isOpen(c <-chan struct{}) bool {
	select {
	case <-c:
		return false
	default:
		return true
	}
}

// errKind names an error by the sentinels it matches, for counting, and
// by NOPERM too if it is a refusal of the user's rights (an acl fault:
// matching ErrQuorum, as every answer retrying cannot change).
func errKind(err error) string {
	var kinds []string
	for _, s := range []struct {
		err  error
		name string
	}{
		{netlock.ErrNotObtained, "ErrNotObtained"}, {netlock.ErrNotHeld, "ErrNotHeld"}, {netlock.ErrLockLost, "ErrLockLost"},
		{netlock.ErrQuorum, "ErrQuorum"}, {netlock.ErrNotLeader, "ErrNotLeader"}, {context.Canceled, "Canceled"}, {context.DeadlineExceeded, "DeadlineExceeded"},
	} {
		if errors.Is(err, s.err) {
			kinds = append(kinds, s.name)
		}
	}
	if len(kinds) == 0 {
		return "UNDOCUMENTED " + err.Error()
	}
	if strings.Contains(err.Error(), "NOPERM") {
		kinds = append(kinds, "NOPERM")
	}
	return strings.Join(kinds, "+")
}
