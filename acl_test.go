package netlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// aclUser creates user on s with rules (after "on >pw"), and returns a
// redigo Backend that authenticates as it.
func aclUser(t *testing.T, s *redistest.Server, user string, rules ...string) Backend {
	t.Helper()
	args := append([]string{"ACL", "SETUSER", user, "reset", "on", ">pw"}, rules...)
	if _, err := s.Do(args...); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return aclBackend(t, s.Addr(), user)
}

// aclBackend returns a redigo Backend that authenticates as user, password
// "pw".
func aclBackend(t *testing.T, addr, user string) Backend {
	t.Helper()
	pool := &redis.Pool{
		MaxIdle: 4,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr, redis.DialUsername(user), redis.DialPassword("pw"))
		},
	}
	t.Cleanup(func() { pool.Close() })
	return NewRedigo(pool)
}

// noChannels are the rules of a user that may run netlock's scripts on its
// keys but neither publish nor subscribe: Redis 7's default for a new user
// (acl-pubsub-default resetchannels).
var noChannels = []string{"~*", "+@all", "resetchannels"}

// wantACLError fails t unless err is the error that names the channel rule
// to add.
func wantACLError(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrQuorum) || !strings.Contains(err.Error(), "NOPERM netlock:") || !strings.Contains(err.Error(), "&"+DefaultPrefix+"*") {
		t.Errorf("%s: got %v, want an error matching ErrQuorum: NOPERM netlock: ... &%s*", what, err, DefaultPrefix)
	}
}

// exists reports whether key exists on s.
func exists(t *testing.T, s *redistest.Server, key string) bool {
	t.Helper()
	n, err := s.Do("EXISTS", key)
	if err != nil {
		t.Fatalf("EXISTS %s: %v", key, err)
	}
	return n == "1"
}

// awaitKey waits until key exists on s.
func awaitKey(t *testing.T, s *redistest.Server, key string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !exists(t, s, key); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not created within 5s", key)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// An Election campaigned for by a user who may not publish fails at once,
// and leaves no leader and no key: another process sees nobody leading.
func TestACLElectionCampaign(t *testing.T) {
	s := redistest.Start(t)
	e, err := NewElection("acl-elect", []Backend{aclUser(t, s, "u", noChannels...)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wantACLError(t, "Campaign", e.Campaign(ctx, "me"))

	other, err := NewElection("acl-elect", []Backend{newBackend(t, "redigo", s.Addr())})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := other.Leader(ctx); !errors.Is(err, ErrNoLeader) {
		t.Errorf("Leader: got %+v, %v, want ErrNoLeader", l, err)
	}
	k := keyspace.Election(DefaultPrefix, "acl-elect")
	for _, key := range []string{k.Lock, k.Leader} {
		if exists(t, s, key) {
			t.Errorf("%s: got a key left behind, want none", key)
		}
	}
}

// A NetMutex released by a user who may not publish, with a waiter queued,
// is either released and granted to the waiter, or left held: never
// reported failed while the waiter got it.
func TestACLMutexUnlockWithWaiter(t *testing.T) {
	s := redistest.Start(t)
	holder, err := New("acl-mutex", []Backend{aclUser(t, s, "u", noChannels...)}, WithExpiry(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := holder.TryLockCtx(ctx); !ok || err != nil {
		t.Fatalf("TryLockCtx: got %v, %v, want true, nil", ok, err)
	}
	value := holder.current().value
	waiter, err := New("acl-mutex", []Backend{newBackend(t, "redigo", s.Addr())}, WithExpiry(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- waiter.LockCtx(ctx) }()
	k := keyspace.New(DefaultPrefix, "acl-mutex", true)
	awaitKey(t, s, k.Waiters)

	err = holder.UnlockCtx(ctx)
	if err == nil {
		if err := <-got; err != nil {
			t.Fatalf("unlock succeeded, waiter's LockCtx: got %v, want nil", err)
		}
		waiter.UnlockCtx(ctx)
		return
	}
	wantACLError(t, "UnlockCtx", err)
	cur, _ := s.Do("GET", k.Lock)
	if !strings.HasPrefix(cur, value+":") {
		t.Errorf("after the failed unlock, the lock key: got %q, want the holder's %q", cur, value)
	}
	select {
	case err := <-got:
		t.Fatalf("unlock failed, yet the waiter's LockCtx returned %v at once", err)
	case <-time.After(200 * time.Millisecond):
	}
	// The hold expires: the waiter gets the lock then.
	if err := <-got; err != nil {
		t.Fatalf("waiter's LockCtx after the hold expired: %v", err)
	}
	waiter.UnlockCtx(ctx)
}

// A Semaphore's permit given back by a user who may not publish, with a
// waiter queued, is either freed (ReleaseCtx returns nil and the waiter
// gets it) or still out (ReleaseCtx fails): never an error while freed.
func TestACLSemaphoreRelease(t *testing.T) {
	s := redistest.Start(t)
	holder, err := NewSemaphore("acl-sem", 1, []Backend{aclUser(t, s, "u", noChannels...)}, WithExpiry(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := holder.TryAcquireCtx(ctx, 1); !ok || err != nil {
		t.Fatalf("TryAcquireCtx: got %v, %v, want true, nil", ok, err)
	}
	waiter, err := NewSemaphore("acl-sem", 1, []Backend{newBackend(t, "redigo", s.Addr())}, WithExpiry(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- waiter.Acquire(ctx, 1) }()
	k := keyspace.Sem(DefaultPrefix, "acl-sem")
	awaitKey(t, s, k.Queue)

	holder.m.mu.Lock()
	lease := holder.value
	holder.m.mu.Unlock()
	start := time.Now()
	err = holder.ReleaseCtx(ctx, 1)
	if err == nil {
		if err := <-got; err != nil {
			t.Fatalf("release succeeded, waiter's Acquire: got %v, want nil", err)
		}
		waiter.ReleaseCtx(ctx, 1)
		return
	}
	wantACLError(t, "ReleaseCtx", err)
	if n, _ := s.Do("HGET", k.Permits, lease); n != "1" {
		t.Errorf("after the failed release, the holder's lease: got %q permits, want 1", n)
	}
	select {
	case err := <-got:
		t.Fatalf("release failed, yet the waiter's Acquire returned %v after %v: the permit was given back", err, time.Since(start))
	case <-time.After(200 * time.Millisecond):
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter's Acquire after the lease ended: %v", err)
	}
	waiter.ReleaseCtx(ctx, 1)
}

// A NetRWMutex writer of a user who may not publish, waiting for a reader,
// fails at once with the error naming the rule to add, and leaves nothing:
// no place in the queues, no hold. So does one whose user may subscribe
// but not publish (its rights changed since the check).
func TestACLRWWriter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules []string
		// revoke, run after a first wait has found the channels allowed:
		// takes the right to publish away.
		revoke []string
	}{
		{name: "resetchannels", rules: noChannels},
		{name: "publish revoked", rules: []string{"~*", "+@all", "&*"}, revoke: []string{"ACL", "SETUSER", "u", "-publish", "-spublish"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redistest.Start(t)
			b := aclUser(t, s, "u", tc.rules...)
			other := newBackend(t, "redigo", s.Addr())
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			reader, err := NewRW("acl-rw", []Backend{other})
			if err != nil {
				t.Fatal(err)
			}
			writer, err := NewRW("acl-rw", []Backend{b})
			if err != nil {
				t.Fatal(err)
			}
			if tc.revoke != nil {
				// A first wait, which checks the channels.
				if err := reader.RLockCtx(ctx); err != nil {
					t.Fatal(err)
				}
				go func() {
					time.Sleep(100 * time.Millisecond)
					reader.RUnlockCtx(ctx)
				}()
				if err := writer.LockCtx(ctx); err != nil {
					t.Fatalf("first LockCtx: %v", err)
				}
				if err := writer.UnlockCtx(ctx); err != nil {
					t.Fatalf("first UnlockCtx: %v", err)
				}
				if _, err := s.Do(tc.revoke...); err != nil {
					t.Fatal(err)
				}
			}
			if err := reader.RLockCtx(ctx); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
			defer wcancel()
			start := time.Now()
			err = writer.LockCtx(wctx)
			wantACLError(t, "writer's LockCtx", err)
			if d := time.Since(start); d > time.Second {
				t.Errorf("writer's LockCtx failed after %v, want at once", d)
			}
			k := keyspace.RW(DefaultPrefix, "acl-rw", true)
			if exists(t, s, k.Writers) || exists(t, s, k.Writer) {
				t.Errorf("after the failed LockCtx: got a writer key or queue left behind, want none")
			}
			if places, _ := s.Do("ZRANGEBYSCORE", k.Leases, "-inf", "0"); places != "" {
				t.Errorf("after the failed LockCtx: got places %q in the leases, want none", places)
			}
			if err := reader.RUnlockCtx(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A waiter whose SUBSCRIBE the server refuses (the rights taken away after
// the channels were checked) fails with the error naming the rule to add,
// rather than polling or hanging.
func TestACLSubscribeRefused(t *testing.T) {
	s := redistest.Start(t)
	b := aclUser(t, s, "u", "~*", "+@all", "&*")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	other := newBackend(t, "redigo", s.Addr())
	holder, err := New("acl-sub", []Backend{other})
	if err != nil {
		t.Fatal(err)
	}
	// A first wait, which checks the channels.
	if err := holder.LockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		holder.UnlockCtx(ctx)
	}()
	first, err := New("acl-sub", []Backend{b})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.LockCtx(ctx); err != nil {
		t.Fatalf("first LockCtx: %v", err)
	}
	if err := first.UnlockCtx(ctx); err != nil {
		t.Fatalf("first UnlockCtx: %v", err)
	}
	if _, err := s.Do("ACL", "SETUSER", "u", "-subscribe", "-ssubscribe"); err != nil {
		t.Fatal(err)
	}
	if err := holder.LockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	defer holder.UnlockCtx(ctx)
	// Another NetMutex of the same name: a channel of its own.
	waiter, err := New("acl-sub", []Backend{b})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	defer wcancel()
	wantACLError(t, "LockCtx", waiter.LockCtx(wctx))
}
