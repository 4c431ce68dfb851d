package netlock

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// fakeCluster returns a miniredis, a Backend on it, and the same Backend
// with a Hub that says it is a Redis Cluster (whose waiters cannot listen:
// they poll). miniredis runs scripts over keys of several slots, so a
// MultiMutex's slot groups run on it as on a Cluster.
func fakeCluster(t *testing.T) (*miniredis.Miniredis, Backend, Backend) {
	t.Helper()
	mr := miniredis.RunT(t)
	b := newBackend(t, "redigo", mr.Addr())
	return mr, b, hubBackend{Backend: b, hub: NewHub(HubConfig{
		Listen:  func(context.Context, func(string, string)) (Listener, error) { return nil, errors.New("unused") },
		Cluster: true,
	})}
}

// On a Backend that says it is a Cluster, NewMulti groups names in several
// slots by slot, in the order of the slots (within one, of the names), and
// Tokens follows the order the names were given in; elsewhere one script
// takes them all.
func TestNewMultiGroupsSlots(t *testing.T) {
	_, b, cluster := fakeCluster(t)
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

// A MultiMutex over several slots used wrongly, or not locked, answers as
// a NetMutex does: ErrNotHeld, a panic on Unlock, a closed Lost, no
// Tokens.
func TestMultiSlotsNotHeld(t *testing.T) {
	_, _, cluster := fakeCluster(t)
	mm, err := NewMulti([]string{"x", "y"}, []Backend{cluster})
	if err != nil {
		t.Fatal(err)
	}
	checkNotHeld(t, mm)
}

// TryLock over several slots is all or nothing: a later slot's name held
// makes it give back the earlier slots' names.
func TestMultiSlotsTryLockAllOrNothing(t *testing.T) {
	_, b, cluster := fakeCluster(t)
	mm, err := NewMulti([]string{"x", "y", "{t}:a"}, []Backend{cluster})
	if err != nil {
		t.Fatal(err)
	}
	groups := groupsOf(mm)
	last := groups[len(groups)-1][0]
	holder := newTestMutex(t, last, b)
	mustLock(t, holder)
	if ok, err := mm.TryLockCtx(context.Background()); ok || err != nil {
		t.Fatalf("TryLockCtx with %s held: got %v, %v; want false, nil", last, ok, err)
	}
	for _, n := range mm.Names() {
		if n == last {
			continue
		}
		if ok, err := newTestMutex(t, n, b).TryLockCtx(context.Background()); !ok || err != nil {
			t.Errorf("NetMutex %s after the MultiMutex's failed TryLockCtx: got %v, %v; want true, nil (given back)", n, ok, err)
		}
	}
}

// A slot's name lost while held (its key deleted) makes ExtendCtx report
// ErrLockLost and closes Lost; Unlock reports it, and releases the others.
func TestMultiSlotsLostOnExtend(t *testing.T) {
	mr, b, cluster := fakeCluster(t)
	mm, err := NewMulti([]string{"x", "y", "{t}:a"}, []Backend{cluster})
	if err != nil {
		t.Fatal(err)
	}
	mustLockMulti(t, mm)
	lost := mm.Lost()
	ctx := context.Background()
	if err := mm.ExtendCtx(ctx); err != nil {
		t.Fatalf("ExtendCtx: %v", err)
	}
	gone := groupsOf(mm)[1][0]
	mr.Del("netlock:{" + gone + "}")
	if err := mm.ExtendCtx(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("ExtendCtx with %s gone: got %v, want ErrLockLost", gone, err)
	}
	select {
	case <-lost:
	default:
		t.Error("Lost not closed after ExtendCtx found a name gone")
	}
	if err := mm.UnlockCtx(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("UnlockCtx: got %v, want ErrLockLost", err)
	}
	// Lost asked for only once the slot is lost is closed at once.
	mustLockMulti(t, mm)
	mr.Del("netlock:{" + gone + "}")
	if err := mm.ExtendCtx(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("ExtendCtx with %s gone again: got %v, want ErrLockLost", gone, err)
	}
	select {
	case <-mm.Lost():
	default:
		t.Error("Lost asked for after ExtendCtx found a name gone: not closed")
	}
	if err := mm.UnlockCtx(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("UnlockCtx: got %v, want ErrLockLost", err)
	}
	for _, n := range mm.Names() {
		if ok, err := newTestMutex(t, n, b).TryLockCtx(ctx); !ok || err != nil {
			t.Errorf("NetMutex %s after Unlock: got %v, %v; want true, nil", n, ok, err)
		}
	}
}
