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
		acquire := func(value, proposal string) []int64 {
			return evalOK(t, b, acquireScript, []string{k.lock, k.tomb(value), k.fence}, []string{value, "8000", proposal})
		}
		release := func(value string) []int64 {
			return evalOK(t, b, releaseScript, []string{k.lock, k.tomb(value)}, []string{value, k.channel, "80000"})
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
		evalOK(t, b, acquireScript, []string{other.lock, other.tomb("o"), other.fence}, []string{"o", "8000", "0"})
		check("acquire retry of our own request", acquire("v1", "0"), 1, 1, 0)
		got := acquire("v2", "0")
		if got[0] != statusOther || got[1] != 2 || got[2] <= 0 || got[2] > 8000 {
			t.Errorf("acquire held: got %v, want [-1 2 pttl]", got)
		}
		check("extend ours", extend("v1"), 1)
		check("extend other's", extend("v2"), -1)
		check("release other's", release("v2"), -1)
		check("release ours, no subscriber", release("v1"), 1, 0)
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
		check("release after ballot", release("v3"), 1, 0)
	})
}
