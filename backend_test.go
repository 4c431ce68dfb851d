package netlock

import (
	"context"
	"slices"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// evalOK runs s on b and fails the test on error.
func evalOK(t *testing.T, b Backend, s *Script, keys, args []string) []int64 {
	t.Helper()
	got, err := b.Eval(context.Background(), s, keys, args)
	if err != nil {
		t.Fatalf("%s: %v", s.Name(), err)
	}
	return got
}

func TestScripts(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		b := e.backend(t)
		k := newKeys("netlock:", "s", true)
		// waiter is "<id>:<flags>"; no holder identity (see lua/acquire.lua).
		acquireAs := func(waiter, value, proposal string) []int64 {
			return evalOK(t, b, acquireScript, []string{k.lock, k.tomb(value), k.waiters, k.fence}, []string{value, "8000", proposal + ":" + waiter + ":80000:"})
		}
		acquire := func(value, proposal string) []int64 { return acquireAs(":", value, proposal) }
		release := func(value string) []int64 {
			return evalOK(t, b, releaseScript, []string{k.lock, k.tomb(value), k.waiters, k.fence}, []string{value, "80000", "8"})
		}
		leave := func(waiter string) []int64 {
			return evalOK(t, b, leaveScript, []string{k.waiters, k.lock, k.fence}, []string{waiter, "8"})
		}
		queue := func() []string {
			q, err := redis.Strings(e.do(t, "ZRANGE", k.waiters, 0, -1), nil)
			if err != nil {
				t.Fatal(err)
			}
			return q
		}
		extend := func(value string) []int64 {
			return evalOK(t, b, extendScript, []string{k.lock, k.waiters}, []string{value, "8000", "80000"})
		}
		check := func(what string, got []int64, want ...int64) {
			t.Helper()
			if !slices.Equal(got, want) {
				t.Errorf("%s: got %v, want %v", what, got, want)
			}
		}
		// listen subscribes a connection of its own to waiter's channel, as
		// a waiter's hub does.
		listen := func(waiter string) {
			t.Helper()
			c, err := redis.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			psc := redis.PubSubConn{Conn: c}
			if err := psc.Subscribe(k.channel + ":" + waiter); err != nil {
				t.Fatal(err)
			}
			if _, ok := psc.Receive().(redis.Subscription); !ok {
				t.Fatalf("subscribing %s: no confirmation", waiter)
			}
		}

		lockValue := func(what, want string) {
			t.Helper()
			if v, _ := redis.String(e.do(t, "GET", k.lock), nil); v != want {
				t.Errorf("lock key %s: got %q, want %q", what, v, want)
			}
		}

		e.do(t, "SCRIPT", "FLUSH") // the first calls fall back to EVAL
		check("acquire free", acquire("v1", "0"), 1, 1, 0)
		// Nobody queued: no '+' (see lua/acquire.lua), so the release only
		// deletes the key.
		lockValue("taken with no queue", "v1:1:")
		// Another name in the same slot ("s}x" has the hash tag "s") moves
		// the shared counter on.
		other := newKeys("netlock:", "s}x", true)
		if other.fence != k.fence {
			t.Fatalf("fence keys differ: %q, %q", other.fence, k.fence)
		}
		evalOK(t, b, acquireScript, []string{other.lock, other.tomb("o"), other.waiters, other.fence}, []string{"o", "8000", "0:::80000:"})
		check("acquire retry of our own request", acquire("v1", "0"), 1, 1, 0)
		// Held: the counter is told to ballots only (a quorum's).
		got := acquire("v2", "0")
		if got[0] != acquireBusy || got[1] != 0 || got[2] <= 0 || got[2] > 8000 {
			t.Errorf("acquire held: got %v, want [-1 0 pttl]", got)
		}
		if got := acquire("v2", "1"); got[0] != acquireBusy || got[1] != 2 {
			t.Errorf("ballot on a held key: got %v, want [-1 2 pttl]", got)
		}
		check("extend ours", extend("v1"), 1)
		check("extend other's", extend("v2"), -1)
		check("release other's", release("v2"), -1)
		// Waiters that listen ("j") queue in arrival order, once each; one
		// that does not listen, or TryLock, does not. A waiter whose turn
		// was lost ("jt") goes to the head.
		acquireAs("w2:j", "x", "0")
		// The first waiter to join marks the holder's value: its release
		// must look at the queue.
		lockValue("after a waiter joined", "v1:1:+")
		acquireAs("w3:j", "y", "0")
		acquireAs("w2:j", "z", "0")
		acquireAs("w9:", "z", "0")
		acquireAs("w4:j", "z", "0")
		acquireAs("w1:jt", "z", "0")
		if q := queue(); !slices.Equal(q, []string{"w1", "w2", "w3", "w4"}) {
			t.Errorf("waiters' queue: got %v, want [w1 w2 w3 w4]", q)
		}
		if ttl, _ := redis.Int(e.do(t, "PTTL", k.waiters), nil); ttl <= 8000 || ttl > 80000 {
			t.Errorf("waiters' queue TTL: got %dms, want (8000, 80000]", ttl)
		}
		// The release skips w1 and w2, whom nobody listens for (their
		// processes died), names w3 and takes it off the queue.
		listen("w3")
		listen("w4")
		check("release ours, two dead waiters ahead", release("v1"), 1, 1, 0, 2)
		if q := queue(); !slices.Equal(q, []string{"w4"}) {
			t.Errorf("waiters' queue after the release: got %v, want [w4]", q)
		}
		// w3 gives up after its turn came, the lock still free: it passes
		// the turn to w4.
		check("leave after the turn came", leave("w3"), 0, 1, 0, 0)
		if q := queue(); len(q) != 0 {
			t.Errorf("waiters' queue after w3 passed its turn: got %v, want empty", q)
		}
		acquireAs("w5:j", "x", "0") // free: takes the lock, does not queue
		acquireAs("w6:j", "y", "0")
		check("leave", leave("w6"), 1)
		check("leave again, the lock held", leave("w6"), 0, 0, 0, 0)
		check("release x", release("x"), 1, 0, 0, 0)
		check("extend absent", extend("v1"), 0)
		check("release absent", release("v1"), 0)
		// release left a tombstone for v1: a late acquire of v1 is refused.
		check("late acquire after release", acquire("v1", "0"), -3, 3, 0)
		// Ballots: a proposal not above the counter is refused, a higher one
		// becomes the counter.
		check("ballot too low", acquire("v3", "3"), -2, 3, 0)
		check("ballot above", acquire("v3", "7"), 1, 7, 0)
		check("retry of a ballot", acquire("v3", "7"), 1, 7, 0)
		if n, _ := redis.Int(e.do(t, "GET", k.fence), nil); n != 7 {
			t.Errorf("fence counter: got %d, want 7", n)
		}
		acquireAs("w7:j", "q", "8")
		acquireAs("w8:j", "r", "8")
		listen("w7")
		check("release after ballot", release("v3"), 1, 1, 0, 0)
		// w7 was named; w8 takes the lock and leaves the queue.
		check("acquire by a queued waiter", acquireAs("w8:jq", "r", "8"), 1, 8, 0)
		if q := queue(); len(q) != 0 {
			t.Errorf("waiters' queue after w8 took the lock: got %v, want empty", q)
		}

		// Grants: a member "<id>+<expiry>+<nonce>+<holder>" is given the lock by the
		// release itself, with the next token, and told so; one nobody
		// listens for is skipped, its grant undone.
		acquireAs("g1+5000+N1+h1:j", "s", "0")
		acquireAs("g2+6000+N2+h2:j", "s", "0")
		acquireAs("g3+7000+N3+h3:j", "s", "0")
		listen("g2")
		listen("g3")
		check("release granting, one dead waiter ahead", release("r"), 1, 1, 1, 1)
		// Others may wait behind a grantee: its value says so.
		lockValue("after the grant (nonce.token:token:holder+)", "N2.10:10:h2+")
		if ttl, _ := redis.Int(e.do(t, "PTTL", k.lock), nil); ttl <= 5000 || ttl > 6000 {
			t.Errorf("granted key's TTL: got %dms, want the grantee's expiry, (5000, 6000]", ttl)
		}
		if n, _ := redis.Int(e.do(t, "GET", k.fence), nil); n != 10 {
			t.Errorf("fence counter after the grant: got %d, want 10 (the undone grant of g1 took 9: a counter may skip, never repeat)", n)
		}
		// g1, skipped and gone from the queue, is not added again under its
		// nonce: it is told to join again under a fresh one.
		if got := acquireAs("g1+5000+N1+h1:jq", "s", "0"); len(got) != 4 || got[0] != acquireBusy || got[3] != 1 {
			t.Errorf("acquire by a member gone from the queue: got %v, want [-1 0 pttl 1]", got)
		}
		if q := queue(); !slices.Equal(q, []string{"g3+7000+N3+h3"}) {
			t.Errorf("waiters' queue after g1 was told to join again: got %v, want [g3+7000+N3+h3]", q)
		}
		// The grantee's own attempt, before or without the message, adopts
		// the grant: its TTL refreshed, the token and n returned.
		check("acquire by the grantee", acquireAs("g2+6000+N2+h2:jq", "fresh", "0"), 1, 10, 10)
		// Another waiter's attempt finds the lock held.
		if got := acquireAs("g3+7000+N3+h3:jq", "s", "0"); got[0] != acquireBusy {
			t.Errorf("acquire by another waiter after the grant: got %v, want held", got)
		}
		// The grantee gives up: leave releases its grant and grants the next.
		check("leave by the grantee", leave("g2+6000+N2+h2"), 0, 1, 1, 0)
		lockValue("after the grantee left", "N3.11:11:h3+")
		check("release the last grant", release("N3.11"), 1, 0, 0, 0)

		// A key taken while the queue exists is marked, though nobody
		// joined during the hold.
		acquireAs("h1:j", "t1", "0")
		acquireAs("h2:j", "u", "0")
		acquireAs("h3:j", "u", "0")
		listen("h2")
		check("release naming h2", release("t1"), 1, 1, 0, 0)
		check("TryLock while h3 waits", acquire("t2", "0"), 1, 13, 0)
		lockValue("taken while h3 waits", "t2:13:+")
		check("release, h3 skipped", release("t2"), 1, 0, 0, 1) // nobody listens for h3
		check("TryLock, the queue gone", acquire("t3", "0"), 1, 14, 0)
		lockValue("taken with the queue gone", "t3:14:")
		check("extend with no queue", extend("t3"), 1)
		check("release with no queue", release("t3"), 1, 0, 0, 0)
		// A value netlock did not write is not marked by a joining waiter.
		e.do(t, "SET", k.lock, "foreign", "PX", 8000)
		acquireAs("f1:j", "f", "0")
		lockValue("foreign, after a waiter joined", "foreign")
	})
}

// TestNewScript: a script of the user's runs through every client's Backend,
// with EVALSHA and the NOSCRIPT fallback.
func TestNewScript(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		s := NewScript("sum", "return {tonumber(ARGV[1]) + tonumber(ARGV[2]), #KEYS}")
		if s.Name() != "sum" || s.Source() == "" || len(s.SHA1()) != 40 {
			t.Fatalf("NewScript: name %q, source %q, SHA1 %q", s.Name(), s.Source(), s.SHA1())
		}
		b := e.backend(t)
		for range 2 { // NOSCRIPT, then the cached script
			vals, err := b.Eval(context.Background(), s, []string{"{k}a", "{k}b"}, []string{"2", "40"})
			if err != nil || len(vals) != 2 || vals[0] != 42 || vals[1] != 2 {
				t.Fatalf("Eval: %v, %v; want [42 2]", vals, err)
			}
		}
	})
}
