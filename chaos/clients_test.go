package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
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

// clients are the client libraries netlock supports: the tests here run
// with each (the chaos workloads with those chaosLibraries selects).
var clients = []string{"redigo", "rueidis", "goredis"}

// clientsEnv selects the client libraries of the chaos tests' clients: a
// comma-separated subset of clients ("redigo,goredis"). Without it, all of
// them. Without rueidis, the faults of rueidisPanics join the rotation
// (faultKinds).
const clientsEnv = "NETLOCK_CHAOS_CLIENTS"

// chaosLibraries returns the client libraries of the chaos tests' clients,
// in the order of clients: those $NETLOCK_CHAOS_CLIENTS names, or all. A
// name that is not in clients fails the test.
func chaosLibraries(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(clientsEnv)
	if v == "" {
		return slices.Clone(clients)
	}
	named := strings.Split(v, ",")
	for _, name := range named {
		if !slices.Contains(clients, name) {
			t.Fatalf("%s=%q: %q is no client library; want a comma-separated subset of %s", clientsEnv, v, name, strings.Join(clients, ","))
		}
	}
	return slices.DeleteFunc(slices.Clone(clients), func(c string) bool { return !slices.Contains(named, c) })
}

// chaosClient returns the client library of the chaos tests' client i, of
// chaosLibraries by turns: by default three redigo, three rueidis and two
// go-redis.
func chaosClient(t testing.TB, i int) string {
	t.Helper()
	libs := chaosLibraries(t)
	return libs[i%len(libs)]
}

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

// TestChaosLibraries: NETLOCK_CHAOS_CLIENTS selects the chaos tests'
// client libraries, in the order of clients, and fails a test on a name it
// does not know; without rueidis, the faults under which rueidis panics
// join the rotation.
func TestChaosLibraries(t *testing.T) {
	tests := []struct {
		env   string
		want  []string
		fatal string // in the failure; "" for none
	}{
		{"", clients, ""},
		{"goredis,redigo", []string{"redigo", "goredis"}, ""},
		{"rueidis", []string{"rueidis"}, ""},
		{"redigo,jedis", nil, `"jedis" is no client library`},
		{"redigo,", nil, `"" is no client library`},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			t.Setenv(clientsEnv, tt.env)
			f := &fatalTB{TB: t}
			var got []string
			done := make(chan struct{})
			go func() {
				defer close(done)
				got = chaosLibraries(f)
			}()
			<-done
			switch {
			case tt.fatal == "" && f.failed != "":
				t.Errorf("%s=%q: failed with %q, want %q", clientsEnv, tt.env, f.failed, tt.want)
			case tt.fatal == "" && !slices.Equal(got, tt.want):
				t.Errorf("%s=%q: got %q, want %q", clientsEnv, tt.env, got, tt.want)
			case tt.fatal != "" && (!strings.Contains(f.failed, tt.fatal) || !strings.Contains(f.failed, clientsEnv)):
				t.Errorf("%s=%q: failed with %q, want a failure naming %s and containing %q", clientsEnv, tt.env, f.failed, clientsEnv, tt.fatal)
			}
		})
	}
	t.Setenv(allFaultsEnv, "")
	for env, want := range map[string]bool{"": false, "redigo,goredis": true, "rueidis,goredis": false} {
		t.Setenv(clientsEnv, env)
		kinds := faultKinds(t, chaosSetup{})
		if got := slices.Contains(kinds, "busy") && slices.Contains(kinds, "misconf"); got != want {
			t.Errorf("%s=%q: faults %q, busy and misconf in them %v, want %v", clientsEnv, env, kinds, got, want)
		}
	}
}

// fatalTB is a testing.TB whose Fatalf records its message and ends the
// calling goroutine, as a test's does, without failing the test.
type fatalTB struct {
	testing.TB
	failed string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
