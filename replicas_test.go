package netlock

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock/internal/redistest"
)

func TestSyncReplicasNew(t *testing.T) {
	mini := miniredis.RunT(t)
	b := newBackend(t, "redigo", mini.Addr())
	b2 := newBackend(t, "rueidis", mini.Addr())
	for _, tc := range []struct {
		name     string
		backends []Backend
		n        int
		want     string // in the error; "" for none
	}{
		{"negative", []Backend{b}, -1, "sync replicas -1 is negative"},
		{"not a waiter", []Backend{evalOnly{b}}, 1, "WithSyncReplicas(1): backend 0 (netlock.evalOnly) cannot wait for replicas"},
		{"second not a waiter", []Backend{b, evalOnly{b2}}, 2, "WithSyncReplicas(2): backend 1 (netlock.evalOnly)"},
		{"off", []Backend{evalOnly{b}}, 0, ""},
		{"waiters", []Backend{b, b2}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New("sync", tc.backends, WithSyncReplicas(tc.n))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("New: %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("New: got error %v, want one containing %q", err, tc.want)
			case tc.want == "" && tc.n > 0 && m.grants:
				t.Errorf("a release may grant the lock with WithSyncReplicas(%d)", tc.n)
			}
		})
	}
}

func TestWaitTimeout(t *testing.T) {
	for _, tc := range []struct {
		left, want time.Duration // want: at most, and more than want-1ms
	}{
		{500 * time.Millisecond, 300 * time.Millisecond},
		{200 * time.Millisecond, 100 * time.Millisecond},
		{2 * time.Millisecond, time.Millisecond},
		{0, time.Millisecond},
		{-time.Second, time.Millisecond},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), tc.left)
		got := WaitTimeout(ctx)
		cancel()
		if got > tc.want || got <= tc.want-2*time.Millisecond || got%time.Millisecond != 0 {
			t.Errorf("WaitTimeout with %v left: got %v, want whole ms just below %v", tc.left, got, tc.want)
		}
	}
	if got, want := WaitTimeout(context.Background()), DefaultNodeTimeout-waitMargin; got != want {
		t.Errorf("WaitTimeout without a deadline: got %v, want %v", got, want)
	}
}

// commandCalls returns how many times s has run cmd (INFO commandstats).
func commandCalls(t *testing.T, s *redistest.Server, cmd string) int {
	t.Helper()
	info, err := s.Do("INFO", "commandstats")
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// With a healthy replica, every acquire waits for it: the lock is on the
// replica when LockCtx returns.
func TestSyncReplicas(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			p, r := startReplicated(t)
			m, err := New("sync", []Backend{newBackend(t, client, p.Addr())}, WithSyncReplicas(1))
			if err != nil {
				t.Fatal(err)
			}
			waits := commandCalls(t, p, "wait")
			const rounds = 5
			for range rounds {
				mustLock(t, m)
				want := heldValue(m)
				if got, err := r.Do("GET", m.keys.lock); got != want {
					t.Fatalf("lock key on the replica as LockCtx returned: got %q (%v), want %q", got, err, want)
				}
				if err := m.ExtendCtx(context.Background()); err != nil {
					t.Fatalf("ExtendCtx: %v", err)
				}
				mustUnlock(t, m)
			}
			if got := commandCalls(t, p, "wait") - waits; got < 2*rounds {
				t.Errorf("the primary ran WAIT %d times for %d acquires and %d extends, want at least %d", got, rounds, rounds, 2*rounds)
			}
		})
	}
}

// With the replica stalled, an acquire is reported at once as not
// replicated, naming the node and the count, and leaves nothing held; when
// the replica is back, locking works again.
func TestSyncReplicasStalled(t *testing.T) {
	// A node timeout well above the default: WAIT's timeout (1.5s) leaves
	// Redis a cron tick to apply it, and a loaded machine (CI, -race) the
	// time to read the reply, before the call's deadline.
	const expiry = 5 * time.Second
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			p, r := startReplicated(t)
			// An outage window far longer than the test: an error ridden out
			// would not come back in time.
			m, err := New("sync", []Backend{newBackend(t, client, p.Addr())},
				WithSyncReplicas(1), WithExpiry(expiry), WithNodeTimeout(2*time.Second), WithOutageWindow(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			r.Pause()
			check := func(what string, err error, took time.Duration) {
				t.Helper()
				if !errors.Is(err, ErrNotReplicated) || !errors.Is(err, ErrQuorum) {
					t.Fatalf("%s: got %v, want an error matching ErrNotReplicated and ErrQuorum", what, err)
				}
				for _, s := range []string{"node 0", "0 of 1 replicas acknowledged"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("%s: error %q does not say %q", what, err, s)
					}
				}
				if took > 5*time.Second {
					t.Errorf("%s took %v: the error was ridden out, not reported at once", what, took)
				}
				if n, _ := p.Do("EXISTS", m.keys.lock); n != "0" {
					t.Errorf("after %s: the lock key exists on the primary, want it released", what)
				}
				t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			err = m.LockCtx(ctx)
			check("LockCtx", err, time.Since(start))

			start = time.Now()
			ok, err := m.TryLockCtx(ctx)
			if ok {
				t.Fatal("TryLockCtx succeeded with the replica stalled")
			}
			check("TryLockCtx", err, time.Since(start))

			r.Resume()
			caughtUp(t, p.Addr(), 1)
			mustLock(t, m)
			mustUnlock(t, m)
		})
	}
}

// A held lock whose replica stalls: its extends do not count, so the hold
// is lost at its local deadline, though the primary answers. When the
// replica is back, locking works again.
func TestSyncReplicasExtendStalled(t *testing.T) {
	// Extends every 500ms, with the default node timeout: WAIT answers
	// (0 replicas) before the call's deadline, so it is the count that
	// makes an extend not count.
	const expiry = 1500 * time.Millisecond
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			p, r := startReplicated(t)
			m, err := New("sync", []Backend{newBackend(t, client, p.Addr())},
				WithSyncReplicas(1), WithExpiry(expiry), WithNodeTimeout(DefaultNodeTimeout))
			if err != nil {
				t.Fatal(err)
			}
			mustLock(t, m)
			r.Pause()
			until, _ := m.current().deadline()
			redistest.Within(t, 10*expiry, "Lost()", func() { <-m.Lost() })
			late := time.Since(until)
			if late < 0 || late > expiry/2 {
				t.Errorf("hold lost %v after its local deadline as of the stall, want at it (extends while the replica stalls must not count)", late)
			}
			r.Resume()
			caughtUp(t, p.Addr(), 1)
			if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
				t.Errorf("UnlockCtx after the hold was lost: got %v, want ErrLockLost", err)
			}
			mustLock(t, m)
			if err := m.ExtendCtx(context.Background()); err != nil {
				t.Errorf("ExtendCtx with the replica back: %v", err)
			}
			mustUnlock(t, m)
		})
	}
}

// The error names the node, the count and the time waited, and matches
// ErrNotReplicated.
func TestReplicaErrorText(t *testing.T) {
	err := nodeError(0, &replicaError{acked: 0, want: 1, took: 480 * time.Millisecond})
	want := "netlock: node 0: not replicated: 0 of 1 replicas acknowledged the write within 480ms"
	if got := fmt.Sprint(err); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !errors.Is(err, ErrNotReplicated) {
		t.Error("does not match ErrNotReplicated")
	}
}

// On a Redis Cluster, EvalWait runs the script and WAIT on the node of the
// lock's slot: with masters that have no replica, an acquire of names in
// every node's slots fails as not replicated (a script sent to another node
// would fail with MOVED instead), and nothing is left held. The scripts
// are first loaded on every node, as in goredis's TestClusterSyncReplicas.
func TestSyncReplicasCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	c := newClusterClient(t, cluster)
	b := NewRueidis(c)
	for i := range 6 {
		m, err := New(fmt.Sprintf("sync-cluster-%d", i), []Backend{b})
		if err != nil {
			t.Fatal(err)
		}
		if !m.TryLock() {
			t.Fatalf("%s: TryLock without WithSyncReplicas failed", m.Name())
		}
		m.Unlock()
	}
	for i := range 6 {
		name := fmt.Sprintf("sync-cluster-%d", i)
		m, err := New(name, []Backend{b}, WithSyncReplicas(1), WithNodeTimeout(2*time.Second)) // WAIT 1.5s, 500ms for its reply: room for a loaded machine
		if err != nil {
			t.Fatal(err)
		}
		ok, err := m.TryLockCtx(context.Background())
		if ok || !errors.Is(err, ErrNotReplicated) || !strings.Contains(err.Error(), "0 of 1 replicas") {
			t.Fatalf("TryLockCtx(%s) on masters without replicas: got %v, %v; want ErrNotReplicated, 0 of 1", name, ok, err)
		}
		if n := clusterInt(t, c, c.B().Exists().Key(m.keys.lock).Build()); n != 0 {
			t.Errorf("%s: the lock key exists after the failed acquire", name)
		}
	}
}
