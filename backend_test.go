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
		// waiter is "<id>", or "<id>:q" when the id may be queued.
		acquireAs := func(waiter, value, proposal string) []int64 {
			return evalOK(t, b, acquireScript, []string{k.lock, k.tomb(value), k.waiters, k.fence}, []string{value, "8000", proposal + ":" + waiter})
		}
		acquire := func(value, proposal string) []int64 { return acquireAs("", value, proposal) }
		release := func(value string) []int64 {
			return evalOK(t, b, releaseScript, []string{k.lock, k.tomb(value), k.waiters}, []string{value, k.channel, "80000"})
		}
		leave := func(waiter string) []int64 {
			return evalOK(t, b, leaveScript, []string{k.waiters}, []string{waiter})
		}
		queue := func() []string {
			q, err := redis.Strings(e.do(t, "ZRANGE", k.waiters, 0, -1), nil)
			if err != nil {
				t.Fatal(err)
			}
			return q
		}
		extend := func(value string) []int64 {
			return evalOK(t, b, extendScript, []string{k.lock}, []string{value, "8000"})
		}
		check := func(what string, got []int64, want ...int64) {
			t.Helper()
			if !slices.Equal(got, want) {
				t.Errorf("%s: got %v, want %v", what, got, want)
			}
		}

		e.do(t, "SCRIPT", "FLUSH") // the first calls fall back to EVAL
		check("acquire free", acquire("v1", "0"), 1, 1, 0)
		// Another name in the same slot ("s}x" has the hash tag "s") moves
		// the shared counter on.
		other := newKeys("netlock:", "s}x", true)
		if other.fence != k.fence {
			t.Fatalf("fence keys differ: %q, %q", other.fence, k.fence)
		}
		evalOK(t, b, acquireScript, []string{other.lock, other.tomb("o"), other.waiters, other.fence}, []string{"o", "8000", "0:"})
		check("acquire retry of our own request", acquire("v1", "0"), 1, 1, 0)
		got := acquire("v2", "0")
		if got[0] != statusOther || got[1] != 2 || got[2] <= 0 || got[2] > 8000 {
			t.Errorf("acquire held: got %v, want [-1 2 pttl]", got)
		}
		check("extend ours", extend("v1"), 1)
		check("extend other's", extend("v2"), -1)
		check("release other's", release("v2"), -1)
		// Waiters queue in arrival order, once each; TryLock ("") does not.
		acquireAs("w2", "x", "0")
		acquireAs("w3", "y", "0")
		acquireAs("w2", "z", "0")
		if q := queue(); !slices.Equal(q, []string{"w2", "w3"}) {
			t.Errorf("waiters' queue: got %v, want [w2 w3]", q)
		}
		// The release names the first waiter (nobody is subscribed here)
		// and takes it off the queue.
		check("release ours, no subscriber", release("v1"), 1, 0)
		if q := queue(); !slices.Equal(q, []string{"w3"}) {
			t.Errorf("waiters' queue after the release: got %v, want [w3]", q)
		}
		check("leave", leave("w3"), 1)
		check("leave again", leave("w3"), 0)
		check("extend absent", extend("v1"), 0)
		check("release absent", release("v1"), 0)
		// release left a tombstone for v1: a late acquire of v1 is refused.
		check("late acquire after release", acquire("v1", "0"), -3, 2, 0)
		// Ballots: a proposal not above the counter is refused, a higher one
		// becomes the counter.
		check("ballot too low", acquire("v3", "2"), -2, 2, 0)
		check("ballot above", acquire("v3", "7"), 1, 7, 0)
		check("retry of a ballot", acquire("v3", "7"), 1, 7, 0)
		if n, _ := redis.Int(e.do(t, "GET", k.fence), nil); n != 7 {
			t.Errorf("fence counter: got %d, want 7", n)
		}
		acquireAs("w4", "q", "8")
		acquireAs("w5", "r", "8")
		check("release after ballot", release("v3"), 1, 0)
		// w4 was named; w5 takes the lock and leaves the queue.
		check("acquire by a queued waiter", acquireAs("w5:q", "r", "8"), 1, 8, 0)
		if q := queue(); len(q) != 0 {
			t.Errorf("waiters' queue after w5 took the lock: got %v, want empty", q)
		}
	})
}
