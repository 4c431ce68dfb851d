package netlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
)

func TestNewMultiRejectsBadInput(t *testing.T) {
	b := newBackend(t, "redigo", miniredis.RunT(t).Addr())
	cluster := hubBackend{Backend: b, hub: NewHub(HubConfig{
		Listen:  func(context.Context, func(string, string)) (Listener, error) { return nil, errors.New("unused") },
		Cluster: true,
	})}
	for _, tc := range []struct {
		what     string
		names    []string
		backends []Backend
		opts     []Option
		want     string // in the error
	}{
		{"no names", nil, []Backend{b}, nil, "no names"},
		{"empty list", []string{}, []Backend{b}, nil, "no names"},
		{"duplicate", []string{"a", "b", "a"}, []Backend{b}, nil, `name "a" given twice`},
		{"empty name", []string{"a", ""}, []Backend{b}, nil, "name 1: netlock: empty lock name"},
		{"name starting with }", []string{"}x", "a"}, []Backend{b}, nil, `name 0: netlock: lock name "}x" starts with '}'`},
		{"no backends", []string{"a"}, nil, nil, "no backends"},
		{"nil backend", []string{"a"}, []Backend{nil}, nil, "backend 0 is nil"},
		{"bad option", []string{"a"}, []Backend{b}, []Option{WithExpiry(0)}, "expiry"},
		{"prefix with a brace", []string{"a"}, []Backend{b}, []Option{WithPrefix("x{")}, "prefix"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			mm, err := NewMulti(tc.names, tc.backends, tc.opts...)
			if err == nil {
				t.Fatalf("NewMulti(%q): got %v, nil; want an error", tc.names, mm)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "netlock: ") {
				t.Errorf("NewMulti(%q): got %q, want an error starting netlock: and containing %q", tc.names, err, tc.want)
			}
		})
	}
	// Names sharing a hash tag are in one slot: accepted on a Cluster.
	if _, err := NewMulti([]string{"{order:7}:stock", "{order:7}:payment"}, []Backend{cluster}); err != nil {
		t.Errorf("NewMulti of names in one slot on a Cluster: %v", err)
	}
	if _, err := NewMulti([]string{"solo"}, []Backend{cluster}); err != nil {
		t.Errorf("NewMulti of one name on a Cluster: %v", err)
	}
}

func TestMultiZeroAndMisuse(t *testing.T) {
	var z MultiMutex
	ctx := context.Background()
	if err := z.LockCtx(ctx); err == nil || !strings.Contains(err.Error(), "NewMulti") {
		t.Errorf("zero LockCtx: got %v, want an error naming NewMulti", err)
	}
	if _, err := z.TryLockCtx(ctx); err == nil {
		t.Error("zero TryLockCtx: got nil error")
	}
	if err := z.UnlockCtx(ctx); err == nil {
		t.Error("zero UnlockCtx: got nil error")
	}
	if err := z.ExtendCtx(ctx); err == nil {
		t.Error("zero ExtendCtx: got nil error")
	}
	if isOpen(z.Lost()) || z.Tokens() != nil || z.Names() != nil {
		t.Error("zero MultiMutex: Lost open, or Tokens or Names not nil")
	}

	mm, err := NewMulti([]string{"b", "a"}, []Backend{newBackend(t, "redigo", miniredis.RunT(t).Addr())})
	if err != nil {
		t.Fatal(err)
	}
	if got := mm.Names(); len(got) != 2 || got[0] != "b" || got[1] != "a" {
		t.Errorf("Names(): got %q, want [b a]", got)
	}
	checkNotHeld(t, mm)
}

func TestClientMulti(t *testing.T) {
	b := newBackend(t, "redigo", miniredis.RunT(t).Addr())
	c, err := NewClient([]Backend{b}, WithPrefix("app:"))
	if err != nil {
		t.Fatal(err)
	}
	mm, err := c.Multi([]string{"x", "y"})
	if err != nil {
		t.Fatalf("Client.Multi: %v", err)
	}
	mustLockMulti(t, mm)
	m, _ := c.Mutex("y")
	if ok, err := m.TryLockCtx(context.Background()); ok || err != nil {
		t.Errorf("Client's NetMutex y under the Client's MultiMutex: got %v, %v; want false, nil", ok, err)
	}
	mm.Unlock()
	if _, err := c.Multi([]string{"x", "x"}); err == nil {
		t.Error("Client.Multi with a name twice: got nil error")
	}
	var zero Client
	if _, err := zero.Multi([]string{"x"}); err == nil {
		t.Error("zero Client's Multi: got nil error")
	}
}

func TestMultiObserved(t *testing.T) {
	var mu sync.Mutex
	var got []string
	obs := Observer{
		Acquire: func(ctx context.Context, a AcquireStart) (context.Context, func(AcquireDone)) {
			return ctx, func(d AcquireDone) {
				mu.Lock()
				got = append(got, fmt.Sprintf("acquire %s %s %v", d.Name, d.Kind, d.Acquired))
				mu.Unlock()
			}
		},
		Unlock: func(_ context.Context, u UnlockDone) {
			mu.Lock()
			got = append(got, fmt.Sprintf("unlock %s %s %v", u.Name, u.Kind, u.Err))
			mu.Unlock()
		},
	}
	mm, err := NewMulti([]string{"y", "x"}, []Backend{newBackend(t, "redigo", miniredis.RunT(t).Addr())}, WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	mustLockMulti(t, mm)
	mm.Unlock()
	want := []string{"acquire y,x multi true", "unlock y,x multi <nil>"}
	if !slices.Equal(got, want) {
		t.Errorf("events: got %q, want %q", got, want)
	}
}
