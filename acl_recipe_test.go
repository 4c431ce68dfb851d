package netlock_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/goredis"
	"github.com/netlock-go/netlock/internal/redistest"
)

// aclRecipe returns the words of the ACL SETUSER command that
// docs/deployments.md gives, as written there.
func aclRecipe(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("docs/deployments.md")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(doc)) {
		if strings.HasPrefix(line, "ACL SETUSER ") {
			return strings.Fields(line)
		}
	}
	t.Fatal("docs/deployments.md: no line ACL SETUSER")
	return nil
}

// The user of the ACL recipe in docs/deployments.md runs every kind of
// lock, waiters included, on every Backend netlock provides, and the server
// refuses it nothing (ACL LOG stays empty).
func TestACLRecipe(t *testing.T) {
	recipe := aclRecipe(t)
	user := recipe[2]
	backends := map[string]func(t *testing.T, addr string) netlock.Backend{
		"redigo": func(t *testing.T, addr string) netlock.Backend {
			pool := &redigo.Pool{MaxIdle: 4, DialContext: func(ctx context.Context) (redigo.Conn, error) {
				return redigo.DialContext(ctx, "tcp", addr, redigo.DialUsername(user), redigo.DialPassword("secret"))
			}}
			t.Cleanup(func() { pool.Close() })
			return netlock.NewRedigo(pool)
		},
		"rueidis": func(t *testing.T, addr string) netlock.Backend {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, Username: user, Password: "secret", DisableCache: true, ForceSingleClient: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			return netlock.NewRueidis(c)
		},
		"goredis": func(t *testing.T, addr string) netlock.Backend {
			c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: "secret", ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			return goredis.New(c)
		},
	}
	for _, client := range []string{"redigo", "rueidis", "goredis"} {
		t.Run(client, func(t *testing.T) {
			s := redistest.Start(t)
			args := append([]string(nil), recipe...)
			if _, err := s.Do(args...); err != nil {
				t.Fatalf("%s: %v", strings.Join(recipe, " "), err)
			}
			// Two processes, each with its own client.
			a, b := backends[client](t, s.Addr()), backends[client](t, s.Addr())
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			runKinds(t, ctx, a, b)
			if log, _ := s.Do("ACL", "LOG"); log != "" {
				t.Errorf("ACL LOG: got %q, want nothing refused", log)
			}
		})
	}
}

// runKinds runs each kind of lock on a and b: a holds, b waits, a lets go,
// b gets it.
func runKinds(t *testing.T, ctx context.Context, a, b netlock.Backend) {
	t.Helper()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// handOff runs take on a, then wait on b while a's release lets it in.
	handOff := func(kind string, take, wait, release, done func() error) {
		t.Helper()
		must(kind+": take", take())
		got := make(chan error, 1)
		go func() { got <- wait() }()
		time.Sleep(50 * time.Millisecond) // b waits, queued
		must(kind+": release", release())
		must(kind+": wait", <-got)
		must(kind+": done", done())
	}

	m1, err := netlock.New("acl-recipe", []netlock.Backend{a})
	must("New", err)
	m2, err := netlock.New("acl-recipe", []netlock.Backend{b})
	must("New", err)
	handOff("NetMutex", func() error { return m1.LockCtx(ctx) }, func() error { return m2.LockCtx(ctx) },
		func() error { return m1.UnlockCtx(ctx) }, func() error { return m2.UnlockCtx(ctx) })

	r1, err := netlock.NewRW("acl-recipe", []netlock.Backend{a})
	must("NewRW", err)
	r2, err := netlock.NewRW("acl-recipe", []netlock.Backend{b})
	must("NewRW", err)
	handOff("NetRWMutex", func() error { return r1.RLockCtx(ctx) }, func() error { return r2.LockCtx(ctx) },
		func() error { return r1.RUnlockCtx(ctx) }, func() error { return r2.UnlockCtx(ctx) })

	s1, err := netlock.NewSemaphore("acl-recipe", 1, []netlock.Backend{a})
	must("NewSemaphore", err)
	s2, err := netlock.NewSemaphore("acl-recipe", 1, []netlock.Backend{b})
	must("NewSemaphore", err)
	handOff("Semaphore", func() error { return s1.Acquire(ctx, 1) }, func() error { return s2.Acquire(ctx, 1) },
		func() error { return s1.ReleaseCtx(ctx, 1) }, func() error { return s2.ReleaseCtx(ctx, 1) })

	mm1, err := netlock.NewMulti([]string{"acl-a", "acl-b"}, []netlock.Backend{a})
	must("NewMulti", err)
	mm2, err := netlock.NewMulti([]string{"acl-a", "acl-b"}, []netlock.Backend{b})
	must("NewMulti", err)
	handOff("MultiMutex", func() error { return mm1.LockCtx(ctx) }, func() error { return mm2.LockCtx(ctx) },
		func() error { return mm1.UnlockCtx(ctx) }, func() error { return mm2.UnlockCtx(ctx) })

	e1, err := netlock.NewElection("acl-recipe", []netlock.Backend{a})
	must("NewElection", err)
	e2, err := netlock.NewElection("acl-recipe", []netlock.Backend{b})
	must("NewElection", err)
	handOff("Election", func() error { return e1.Campaign(ctx, "one") }, func() error { return e2.Campaign(ctx, "two") },
		func() error { return e1.Resign(ctx) }, func() error {
			l, err := e1.Leader(ctx)
			if err == nil && l.Value != "two" {
				t.Errorf("Leader: got %q, want two", l.Value)
			}
			return err
		})
	must("Resign", e2.Resign(ctx))

	// Inspect reads the server's memory policy with INFO.
	if _, err := netlock.Inspect(ctx, "acl-recipe", []netlock.Backend{a}); err != nil {
		t.Errorf("Inspect: %v", err)
	}
}
