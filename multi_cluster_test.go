package netlock

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// TestMultiCluster runs MultiMutexes on a real 3-master Redis Cluster
// through rueidis cluster clients (sharded pub/sub): names in one slot lock
// and wait by message; names in several slots are refused by NewMulti.
func TestMultiCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	backend := func() Backend { return NewRueidis(newClusterClient(t, cluster)) }

	if _, err := NewMulti([]string{"a", "b"}, []Backend{backend()}); err == nil || !strings.Contains(err.Error(), "different hash slots") {
		t.Errorf("NewMulti of names in two slots on a Cluster: got %v, want an error naming the slots", err)
	}

	// A Backend that does not say it is a Cluster (redigo on one node) is
	// not refused by NewMulti; the server's CROSSSLOT comes back at once.
	plain, err := NewMulti([]string{"a", "b"}, []Backend{newBackend(t, "redigo", cluster.Addrs()[0])})
	if err != nil {
		t.Fatalf("NewMulti on a redigo Backend: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := plain.LockCtx(ctx); err == nil || !strings.Contains(err.Error(), "CROSSSLOT") || ctx.Err() != nil {
		t.Errorf("LockCtx of names in two slots on a Cluster node: got %v, want the server's CROSSSLOT error at once", err)
	}

	names := []string{"{order:7}:stock", "{order:7}:payment", "{order:7}:mail"}
	var s section
	var wg sync.WaitGroup
	const rounds = 10
	for i := range 3 {
		ns := append([]string(nil), names...)
		if i%2 == 1 {
			ns[0], ns[2] = ns[2], ns[0]
		}
		mm, err := NewMulti(ns, []Backend{backend()})
		if err != nil {
			t.Fatalf("NewMulti(%q): %v", ns, err)
		}
		wg.Go(func() {
			for range rounds {
				mustLockMulti(t, mm)
				s.run(100 * time.Microsecond)
				mm.Unlock()
			}
		})
	}
	m, err := New(names[1], []Backend{backend()})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		for range rounds {
			mustLock(t, m)
			s.run(100 * time.Microsecond)
			m.Unlock()
		}
	})
	wg.Wait()
	s.check(t, 4*rounds)
	probe, err := NewMulti(names, []Backend{backend()})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := probe.TryLockCtx(context.Background()); !ok || err != nil {
		t.Fatalf("TryLockCtx after the others: got %v, %v; want true, nil", ok, err)
	}
	probe.Unlock()
}
