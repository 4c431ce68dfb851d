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

	"github.com/netlock-go/netlock/internal/keyspace"
)

// clusterHubBackend is a Backend whose Hub says it is a Redis Cluster
// (HubConfig.Cluster), over a miniredis that never sees a call.
type clusterHubBackend struct {
	Backend
	hub *Hub
}

func (b clusterHubBackend) Hub() *Hub { return b.hub }

func TestNewMultiRejectsBadInput(t *testing.T) {
	b := newBackend(t, "redigo", miniredis.RunT(t).Addr())
	cluster := clusterHubBackend{Backend: b, hub: NewHub(HubConfig{
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

// On a Backend that says it is a Cluster, NewMulti groups names in several
// slots by slot, in the order of the slots (within one, of the names), and
// Tokens follows the order the names were given in; elsewhere one script
// takes them all.
func TestNewMultiGroupsSlots(t *testing.T) {
	b := newBackend(t, "redigo", miniredis.RunT(t).Addr())
	cluster := clusterHubBackend{Backend: b, hub: NewHub(HubConfig{
		Listen:  func(context.Context, func(string, string)) (Listener, error) { return nil, errors.New("unused") },
		Cluster: true,
	})}
	names := []string{"{t}:b", "x", "{t}:a", "y"}
	slot := func(n string) uint16 { return keyspace.Slot("netlock:{" + n + "}") }
	if slot("x") == slot("y") || slot("x") == slot("{t}:a") || slot("y") == slot("{t}:a") {
		t.Fatalf("slots of x, y, {t}:a: %d, %d, %d; want three", slot("x"), slot("y"), slot("{t}:a"))
	}
	mm, err := NewMulti(names, []Backend{cluster})
	if err != nil {
		t.Fatalf("NewMulti(%q) on a Cluster: %v", names, err)
	}
	s, ok := mm.m.(*slotGroups)
	if !ok {
		t.Fatalf("NewMulti(%q) on a Cluster: got %T, want slot groups", names, mm.m)
	}
	var got [][]string
	var slots []uint16
	for _, g := range s.groups {
		got = append(got, g.kind.(*multiKind).names)
		slots = append(slots, slot(g.kind.(*multiKind).names[0]))
	}
	if !slices.IsSorted(slots) || len(got) != 3 {
		t.Errorf("groups %q in slots %v, want three, in the order of the slots", got, slots)
	}
	for i, n := range names {
		if g := got[s.of[i]]; !slices.Contains(g, n) {
			t.Errorf("name %q: its group %q does not hold it", n, g)
		}
	}
	if i := slices.IndexFunc(got, func(g []string) bool { return len(g) == 2 }); i < 0 || !slices.Equal(got[i], []string{"{t}:a", "{t}:b"}) {
		t.Errorf("groups %q, want {t}:a and {t}:b together, in sorted order", got)
	}
	// miniredis takes keys of several slots in one script: a NetMutex of x
	// moves x's slot's counter on, and the tokens differ by group.
	x, err := New("x", []Backend{cluster})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		mustLock(t, x)
		mustUnlock(t, x)
	}
	if ok, err := mm.TryLockCtx(context.Background()); !ok || err != nil {
		t.Fatalf("TryLockCtx: got %v, %v; want true, nil", ok, err)
	}
	if got, want := mm.Tokens(), []uint64{1, 4, 1, 1}; !slices.Equal(got, want) {
		t.Errorf("Tokens of %q: got %v, want %v", names, got, want)
	}
	mm.Unlock()
	one, err := NewMulti(names, []Backend{b})
	if err != nil {
		t.Fatalf("NewMulti(%q) on one server: %v", names, err)
	}
	if _, ok := one.m.(oneSlot); !ok {
		t.Errorf("NewMulti(%q) on one server: got %T, want one script per node", names, one.m)
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
	if err := mm.UnlockCtx(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("UnlockCtx not locked: got %v, want ErrNotHeld", err)
	}
	if err := mm.ExtendCtx(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("ExtendCtx not locked: got %v, want ErrNotHeld", err)
	}
	func() {
		defer func() {
			if err, _ := recover().(error); !errors.Is(err, ErrNotHeld) {
				t.Errorf("Unlock not locked: panic %v, want one matching ErrNotHeld", err)
			}
		}()
		mm.Unlock()
	}()
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
