package netlock

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// wantHolder checks that Inspect reports the lock name held by holder
// ("": free) on nodes, as a whole and on each node.
func wantHolder(t *testing.T, name string, nodes []Backend, holder string, what string) {
	t.Helper()
	info := mustInspect(t, name, nodes)
	if info.Held != (holder != "") || info.HolderInfo != holder {
		t.Errorf("%s: Inspect got Held %v, HolderInfo %q; want %v, %q", what, info.Held, info.HolderInfo, holder != "", holder)
	}
	for i, n := range info.Nodes {
		if n.HolderInfo != holder {
			t.Errorf("%s: node %d HolderInfo %q, want %q", what, i, n.HolderInfo, holder)
		}
	}
}

// TestHolderInfoMutex follows the holder's identity through a NetMutex's
// holds on every server and client: the default, "<hostname>/<pid>"; a
// waiter's own, in a hold a release granted it by message (not the
// releaser's); the same after a hand-off to another goroutine of its
// process; none once the lock is free, or with WithHolderInfo("").
func TestHolderInfoMutex(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		nodes := []Backend{e.backend(t)}
		wantHolder(t, "job", nodes, "", "never used")

		a := e.newMutex(t, "job", WithExpiry(time.Minute))
		mustLock(t, a)
		wantHolder(t, "job", nodes, selfHolder(t), "default")

		w := e.newMutex(t, "job", WithExpiry(time.Minute), WithHolderInfo(oddHolder))
		errc := async(w.LockCtx)
		var member string
		eventually(t, 5*time.Second, "the waiter queued", func() bool {
			if q := e.queued(t, "job"); len(q) == 1 {
				member = q[0]
			}
			return member != ""
		})
		mustUnlock(t, a)
		mustGet(t, errc)
		// A member with a nonce is granted the lock by the release (see
		// lua/handon.lua); a plain one acquires for itself.
		if granted := grantedValue(w.current()); granted != strings.Contains(member, "+") || granted != w.grants {
			t.Errorf("queued as %q, granted by the release %v", member, granted)
		}
		wantHolder(t, "job", nodes, oddHolder, "granted to the waiter")

		token := w.Token()
		errc = async(w.LockCtx)
		eventually(t, 5*time.Second, "a goroutine waiting on w", func() bool { all, _ := w.localWaiters(); return all == 1 })
		mustUnlock(t, w)
		mustGet(t, errc)
		if w.Token() != token {
			t.Fatalf("token %d after the hand-off, want %d: not handed over", w.Token(), token)
		}
		wantHolder(t, "job", nodes, oddHolder, "handed to another goroutine")

		mustUnlock(t, w)
		wantHolder(t, "job", nodes, "", "unlocked")

		none := e.newMutex(t, "job", WithHolderInfo(""))
		mustLock(t, none)
		if info := mustInspect(t, "job", nodes); !info.Held || info.HolderInfo != "" || info.Token != none.Token() {
			t.Errorf("WithHolderInfo(\"\"): got Held %v, HolderInfo %q, token %d; want held by token %d, no identity", info.Held, info.HolderInfo, info.Token, none.Token())
		}
		mustUnlock(t, none)
	})
}

// TestHolderInfoQuorum: over three nodes, each node's key carries the
// identity of the hold, and Inspect reports it.
func TestHolderInfoQuorum(t *testing.T) {
	var nodes, own []Backend
	for range 3 {
		addr := miniredis.RunT(t).Addr()
		nodes = append(nodes, newBackend(t, "redigo", addr))
		own = append(own, newBackend(t, "redigo", addr))
	}
	m, err := New("job", own, WithHolderInfo("q"))
	if err != nil {
		t.Fatal(err)
	}
	mustLock(t, m)
	wantHolder(t, "job", nodes, "q", "quorum")
	mustUnlock(t, m)
	wantHolder(t, "job", nodes, "", "unlocked")
}

// leaseHolders returns the identities of the leases in the sorted set key
// (members with a positive score: a NetRWMutex's read leases, a
// Semaphore's leases), sorted.
func leaseHolders(t *testing.T, e *env, key string) []string {
	t.Helper()
	leases, err := redis.Strings(e.do(t, "ZRANGEBYSCORE", key, "(0", "+inf"), nil)
	if err != nil {
		t.Fatal(err)
	}
	holders := []string{}
	for _, l := range leases {
		holders = append(holders, keyspace.LeaseHolder(l))
	}
	slices.Sort(holders)
	return holders
}

// rwHolders returns the identities of the NetRWMutex name's writer key and
// of its live read leases, sorted.
func rwHolders(t *testing.T, e *env, name string) (writer string, readers []string) {
	t.Helper()
	k := keyspace.RW(DefaultPrefix, name, true)
	if v, err := redis.String(e.do(t, "GET", k.Writer), nil); err == nil {
		writer = keyspace.HolderOf(v)
	}
	return writer, leaseHolders(t, e, k.Leases)
}

// TestHolderInfoRW: a NetRWMutex's write lock and each read lease carry
// their process's identity, taken by an acquire or granted by a release.
func TestHolderInfoRW(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		k := keyspace.RW(DefaultPrefix, "doc", true)
		queued := func(key string) bool { n, _ := redis.Int(e.do(t, "ZCARD", key), nil); return n > 0 }
		check := func(what, writer string, readers ...string) {
			t.Helper()
			gw, gr := rwHolders(t, e, "doc")
			if gw != writer || !slices.Equal(gr, sorted(append([]string{}, readers...))) {
				t.Errorf("%s: writer %q, readers %q; want %q, %q", what, gw, gr, writer, readers)
			}
		}
		w1 := e.newRW(t, "doc", WithExpiry(time.Minute), WithHolderInfo("writer-1"))
		if err := w1.LockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		check("writer", "writer-1")

		r2 := e.newRW(t, "doc", WithExpiry(time.Minute), WithHolderInfo(oddHolder))
		rerr := async(r2.RLockCtx)
		eventually(t, 5*time.Second, "the reader queued", func() bool { return queued(k.Readers) })
		if err := w1.UnlockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		mustGet(t, rerr)
		// Whether the release granted the lease (see TestRWGrantReaders)
		// or the reader took it, it is the reader's.
		check("a reader let in by the writer's release", "", oddHolder)

		r4 := e.newRW(t, "doc", WithExpiry(time.Minute))
		if err := r4.RLockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		check("two readers", "", oddHolder, selfHolder(t))
		if err := r4.RUnlockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}

		w3 := e.newRW(t, "doc", WithExpiry(time.Minute), WithHolderInfo("writer-3"))
		werr := async(w3.LockCtx)
		eventually(t, 5*time.Second, "the writer queued", func() bool { return queued(k.Writers) })
		if err := r2.RUnlockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		mustGet(t, werr)
		check("a writer let in by the last reader's release", "writer-3")
		if err := w3.UnlockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		check("free", "")
	})
}

// TestHolderInfoSemaphore: each lease of a Semaphore carries its process's
// identity, taken by an acquire or granted by a release, and goes with it.
func TestHolderInfoSemaphore(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		k := keyspace.Sem(DefaultPrefix, "pool")
		holders := func() []string { return leaseHolders(t, e, k.Leases) }
		s1 := e.newSem(t, "pool", 2, WithHolderInfo("sem-1"))
		s2 := e.newSem(t, "pool", 2)
		mustAcquire(t, s1, 1)
		mustAcquire(t, s2, 1)
		if got, want := holders(), []string{"sem-1", selfHolder(t)}; !slices.Equal(got, sorted(want)) {
			t.Errorf("two leases: holders %q, want %q", got, sorted(want))
		}
		s3 := e.newSem(t, "pool", 2, WithHolderInfo(oddHolder))
		errc := async(func(ctx context.Context) error { return s3.Acquire(ctx, 1) })
		eventually(t, 5*time.Second, "the waiter queued", func() bool { n, _ := redis.Int(e.do(t, "ZCARD", k.Queue), nil); return n > 0 })
		if err := s1.ReleaseCtx(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		mustGet(t, errc)
		if got, want := holders(), []string{oddHolder, selfHolder(t)}; !slices.Equal(got, sorted(want)) {
			t.Errorf("a lease let in by a release: holders %q, want %q", got, sorted(want))
		}
		if info, err := s1.Inspect(t.Context()); err != nil || !slices.Equal(sorted(info.Holders), sorted([]string{oddHolder, selfHolder(t)})) {
			t.Errorf("Inspect: holders %q, %v; want %q", info.Holders, err, sorted([]string{oddHolder, selfHolder(t)}))
		}
		for _, s := range []*Semaphore{s2, s3} {
			if err := s.ReleaseCtx(t.Context(), 1); err != nil {
				t.Fatal(err)
			}
		}
		if got := holders(); len(got) != 0 {
			t.Errorf("after every release: holders %q, want none", got)
		}
	})
}

// TestHolderInfoMultiElection: a MultiMutex's names and an Election's lock
// carry the holder's identity too.
func TestHolderInfoMultiElection(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		nodes := []Backend{e.backend(t)}
		mm := e.newMulti(t, []string{"a", "b"}, WithHolderInfo("multi"))
		mustLockMulti(t, mm)
		for _, name := range []string{"a", "b"} {
			wantHolder(t, name, nodes, "multi", "MultiMutex name "+name)
		}
		if err := mm.UnlockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		wantHolder(t, "a", nodes, "", "MultiMutex unlocked")

		el := e.newElection(t, "leader", WithHolderInfo("elected"))
		mustCampaign(t, el, "v")
		v, err := redis.String(e.do(t, "GET", keyspace.Election(DefaultPrefix, "leader").Lock), nil)
		if err != nil || keyspace.HolderOf(v) != "elected" {
			t.Errorf("election lock key %q (%v), want the identity elected", v, err)
		}
		if l, err := el.Leader(t.Context()); err != nil || l.Value != "v" {
			t.Errorf("Leader: %+v, %v; want v", l, err)
		}
		if err := el.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}
