package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/netlock-go/netlock/fence"
)

// step is one fenced write or delete and what it must do.
type step struct {
	del   bool // fence.Delete instead of fence.Set
	token uint64
	value string
	stale bool // the step must fail with ErrStale, changing nothing
}

// runSteps runs steps in order on key and checks each one's error and what
// key holds after it.
func runSteps(t *testing.T, s server, key string, steps []step) {
	t.Helper()
	b := s.backend(t)
	ctx := context.Background()
	for i, st := range steps {
		before := s.dump(t, key)
		var err error
		if st.del {
			err = fence.Delete(ctx, b, key, st.token)
		} else {
			err = fence.Set(ctx, b, key, st.value, st.token)
		}
		if st.stale {
			if !errors.Is(err, fence.ErrStale) {
				t.Fatalf("step %d %+v: got %v, want ErrStale", i, st, err)
			}
			if after := s.dump(t, key); after != before {
				t.Fatalf("step %d %+v: refused, but key changed from %s to %s", i, st, before, after)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d %+v: got %v, want nil", i, st, err)
		}
		value, ok, token := s.fenced(t, key)
		if want := strconv.FormatUint(st.token, 10); token != want {
			t.Fatalf("step %d %+v: got token %q recorded, want %q", i, st, token, want)
		}
		if st.del && ok {
			t.Fatalf("step %d %+v: got value %q after the delete, want none", i, st, value)
		}
		if !st.del && (!ok || value != st.value) {
			t.Fatalf("step %d %+v: got value %q (present %v), want %q", i, st, value, ok, st.value)
		}
	}
}

// TestSet: a write is made and its token recorded when its token is at
// least the recorded one; a lower token is refused and changes nothing.
func TestSet(t *testing.T) {
	const above53 = 1<<53 + 1 // not a double: Lua numbers would round it
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"first write recorded", []step{{token: 7, value: "a"}}},
		{"same token writes again", []step{{token: 7, value: "a"}, {token: 7, value: "b"}}},
		{"higher token overwrites", []step{{token: 7, value: "a"}, {token: 8, value: "b"}}},
		{"lower token stale", []step{{token: 8, value: "a"}, {token: 7, value: "b", stale: true}}},
		{"lower token stale after a higher", []step{
			{token: 1, value: "a"}, {token: 5, value: "b"}, {token: 4, value: "c", stale: true}, {token: 5, value: "d"}}},
		{"digits: 9 then 10", []step{
			{token: 999_999_999, value: "a"}, {token: 1_000_000_000, value: "b"}, {token: 999_999_999, value: "c", stale: true}}},
		{"digits: same high, lower low", []step{
			{token: 5_000_000_002, value: "a"}, {token: 5_000_000_001, value: "b", stale: true}, {token: 6_000_000_000, value: "c"}}},
		{"above 2^53", []step{
			{token: above53, value: "a"}, {token: above53 - 1, value: "b", stale: true}, {token: above53 + 1, value: "c"}}},
		{"MaxUint64", []step{
			{token: math.MaxUint64 - 1, value: "a"}, {token: math.MaxUint64, value: "b"},
			{token: math.MaxUint64 - 1, value: "c", stale: true}, {token: math.MaxUint64, value: "d"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			forEachServer(t, func(t *testing.T, s server) { runSteps(t, s, "k", c.steps) })
		})
	}
}

// TestSetValues: any bytes round-trip, ':' and NUL among them.
func TestSetValues(t *testing.T) {
	values := []string{"", ":", "1:2:3", "7:", "a\x00b\xff\xfe:\r\n", strings.Repeat("x:", 10_000)}
	forEachServer(t, func(t *testing.T, s server) {
		for i, v := range values {
			runSteps(t, s, fmt.Sprintf("k%d", i), []step{{token: 3, value: v}, {token: 3, value: v + "!"}, {token: 2, value: "z", stale: true}})
		}
	})
}

// TestStaleError: the error of a stale write names the key, the token given
// and the one recorded, exactly, over the whole uint64 range.
func TestStaleError(t *testing.T) {
	forEachServer(t, func(t *testing.T, s server) {
		b := s.backend(t)
		ctx := context.Background()
		for _, c := range []struct{ recorded, given uint64 }{
			{5, 4},
			{1_000_000_000, 999_999_999},
			{1<<53 + 1, 1 << 53},
			{math.MaxUint64, math.MaxUint64 - 1},
		} {
			key := fmt.Sprintf("k%d", c.recorded)
			if err := fence.Set(ctx, b, key, "a", c.recorded); err != nil {
				t.Fatalf("Set(%d): %v", c.recorded, err)
			}
			for _, err := range []error{fence.Set(ctx, b, key, "b", c.given), fence.Delete(ctx, b, key, c.given)} {
				if !errors.Is(err, fence.ErrStale) {
					t.Fatalf("token %d after %d: got %v, want ErrStale", c.given, c.recorded, err)
				}
				for _, want := range []string{"fence: ", strconv.Quote(key), fmt.Sprintf("token %d:", c.given), fmt.Sprintf("token %d is recorded", c.recorded)} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("got %q, want it to contain %q", err, want)
					}
				}
			}
		}
	})
}

// TestSetConcurrent: writers racing with tokens 1..n in any order leave the
// highest token and its value, whichever order they reach Redis in: the
// check and the write are one script.
func TestSetConcurrent(t *testing.T) {
	const writers = 32
	forEachServer(t, func(t *testing.T, s server) {
		b := s.backend(t)
		ctx := context.Background()
		errs := make(chan error, writers)
		var wg sync.WaitGroup
		for i := range writers {
			token := uint64(i + 1)
			wg.Go(func() { errs <- fence.Set(ctx, b, "k", strconv.FormatUint(token, 10), token) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil && !errors.Is(err, fence.ErrStale) {
				t.Errorf("Set: got %v, want nil or ErrStale", err)
			}
		}
		want := strconv.Itoa(writers)
		if value, _, token := s.fenced(t, "k"); value != want || token != want {
			t.Fatalf("got value %q and token %q, want %q and %q", value, token, want, want)
		}
	})
}
