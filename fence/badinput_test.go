package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/fence"
)

// op is Set or Delete, for tests that hold both to the same rule.
type op struct {
	name string
	run  func(ctx context.Context, b netlock.Backend, key string, token uint64) error
}

var ops = []op{
	{"Set", func(ctx context.Context, b netlock.Backend, key string, token uint64) error {
		return fence.Set(ctx, b, key, "new", token)
	}},
	{"Delete", fence.Delete},
}

// TestBadInput: a nil Backend, an empty key and token 0 are refused before
// any call to Redis, each with an error that says what is wrong.
func TestBadInput(t *testing.T) {
	forEachServer(t, func(t *testing.T, s server) {
		b := s.backend(t)
		for _, o := range ops {
			for _, c := range []struct {
				name  string
				b     netlock.Backend
				key   string
				token uint64
				want  string
			}{
				{"nil Backend", nil, "k", 1, `fence: ` + strings.ToLower(o.name) + ` "k": nil Backend`},
				{"empty key", b, "", 1, `fence: ` + strings.ToLower(o.name) + `: empty key`},
				{"token 0", b, "k", 0, `fence: ` + strings.ToLower(o.name) + ` "k": token 0 (tokens start at 1;`},
			} {
				err := o.run(context.Background(), c.b, c.key, c.token)
				if err == nil || !strings.HasPrefix(err.Error(), c.want) {
					t.Errorf("%s, %s: got %v, want an error starting %q", o.name, c.name, err, c.want)
				}
				if errors.Is(err, fence.ErrStale) || errors.Is(err, fence.ErrNotFenced) {
					t.Errorf("%s, %s: got %v, matching a sentinel of Redis's answers", o.name, c.name, err)
				}
			}
			if n := s.do(t, "DBSIZE").(int64); n != 0 {
				t.Errorf("%s: %d keys after bad input, want 0", o.name, n)
			}
		}
	})
}

// TestNotFenced: a key that holds anything but a fenced value is refused
// with ErrNotFenced, and left as it was.
func TestNotFenced(t *testing.T) {
	forEachServer(t, func(t *testing.T, s server) {
		b := s.backend(t)
		for _, c := range []struct {
			name  string
			setup []any
			want  string
		}{
			{"string", []any{"SET", "k", "7:v"}, "another Redis type than a hash"},
			{"list", []any{"RPUSH", "k", "a", "b"}, "another Redis type than a hash"},
			{"hash of other fields", []any{"HSET", "k", "name", "x"}, "a hash with fields other than"},
			{"hash with a third field", []any{"HSET", "k", "v", "a", "t", "3", "x", "y"}, "a hash with fields other than"},
			{"hash with a value but no token", []any{"HSET", "k", "v", "a"}, "a hash with fields other than"},
			{"token not a number", []any{"HSET", "k", "v", "a", "t", "x"}, `whose "t" is not a token`},
			{"token with a leading zero", []any{"HSET", "k", "t", "07"}, `whose "t" is not a token`},
			{"token 0", []any{"HSET", "k", "t", "0"}, `whose "t" is not a token`},
			{"token negative", []any{"HSET", "k", "t", "-1"}, `whose "t" is not a token`},
			{"token above MaxUint64", []any{"HSET", "k", "t", "18446744073709551616"}, `whose "t" is not a token`},
			{"token of 21 digits", []any{"HSET", "k", "t", "100000000000000000000"}, `whose "t" is not a token`},
		} {
			for _, o := range ops {
				s.do(t, "DEL", "k")
				s.do(t, c.setup...)
				before := s.dump(t, "k")
				err := o.run(context.Background(), b, "k", 5)
				if !errors.Is(err, fence.ErrNotFenced) || !strings.Contains(err.Error(), c.want) ||
					!strings.Contains(err.Error(), `"k"`) {
					t.Errorf("%s on a %s: got %v, want ErrNotFenced naming the key and saying %q", o.name, c.name, err, c.want)
				}
				if after := s.dump(t, "k"); after != before {
					t.Errorf("%s on a %s: key changed from %s to %s", o.name, c.name, before, after)
				}
			}
		}
	})
}

// TestContextDone: a context already done is returned, wrapped, and
// nothing is written.
func TestContextDone(t *testing.T) {
	forEachServer(t, func(t *testing.T, s server) {
		b := s.backend(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for _, o := range ops {
			if err := o.run(ctx, b, "k", 1); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), `"k"`) {
				t.Errorf("%s: got %v, want context.Canceled naming the key", o.name, err)
			}
		}
		if n := s.do(t, "DBSIZE").(int64); n != 0 {
			t.Errorf("%d keys after calls with a done context, want 0", n)
		}
	})
}
