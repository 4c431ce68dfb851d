package netlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// settlesFree fails the test unless, soon after a stalled server resumed,
// the lock key for name is gone from every server and stays gone. A resumed
// server runs what was sent to it while it was stopped, in some order: our
// late acquire may set the key for a moment before our release (also late)
// deletes it, or meet the release's tombstone first. A stranded key would
// stay for the whole expiry (8s).
func settlesFree(t *testing.T, servers []*redistest.Server, name string) {
	t.Helper()
	eventually(t, time.Second, fmt.Sprintf("lock key %q gone from every server after the caller gave up", name), func() bool {
		return holders(t, servers, name) == 0
	})
	// Looked at every 20ms for 300ms: that it stays gone is a check over a
	// period, not an ordering.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if n := holders(t, servers, name); n != 0 {
			t.Fatalf("lock key %q reappeared on %d servers after the caller gave up", name, n)
		}
	}
}

func TestQuorumExcludes(t *testing.T) {
	for _, n := range []int{3, 5} {
		for _, client := range testClients() {
			t.Run(fmt.Sprintf("%d/%s", n, client), func(t *testing.T) {
				servers := startServers(t, n)
				const clients, rounds = 8, 15
				var s section
				var mu sync.Mutex
				var tokens []uint64 // in acquisition order: appended inside the lock
				var wg sync.WaitGroup
				for range clients {
					m := quorumMutex(t, client, servers, "q")
					wg.Go(func() {
						for range rounds {
							m.Lock()
							mu.Lock()
							tokens = append(tokens, m.Token())
							mu.Unlock()
							s.run(100 * time.Microsecond)
							m.Unlock()
						}
					})
				}
				wg.Wait()
				s.check(t, clients*rounds)
				for i := 1; i < len(tokens); i++ {
					if tokens[i] <= tokens[i-1] {
						t.Fatalf("token %d after %d: tokens must strictly increase in acquisition order", tokens[i], tokens[i-1])
					}
				}
				if h := holders(t, servers, "q"); h != 0 {
					t.Errorf("lock key left on %d servers", h)
				}
			})
		}
	}
}

func TestQuorumMinorityDown(t *testing.T) {
	servers := startServers(t, 5)
	a := quorumMutex(t, "redigo", servers, "minority", WithNodeTimeout(150*time.Millisecond))
	b := quorumMutex(t, "rueidis", servers, "minority", WithNodeTimeout(150*time.Millisecond))
	servers[1].Pause()
	servers[3].Kill()
	var last uint64
	for i := range 6 {
		m := a
		if i%2 == 1 {
			m = b
		}
		mustLock(t, m)
		if tok := m.Token(); tok <= last {
			t.Errorf("token %d after %d", tok, last)
		} else {
			last = tok
		}
		if err := m.ExtendCtx(context.Background()); err != nil {
			t.Errorf("ExtendCtx with a minority down: %v", err)
		}
		mustUnlock(t, m)
	}
	servers[1].Resume()
	settlesFree(t, servers[:3], "minority")
}

// TestQuorumFirstNodeStalled: over redigo Backends a fanout reads the
// replies one node after the other (see fanoutPipelined). With the first
// node stalled, its read runs to the node timeout; the replies the other
// nodes sent meanwhile still count, and make the quorum. Without an outage
// window, a round that missed them would fail LockCtx. (After the first
// round, node 0 has no idle connection: its calls go on a goroutine of
// their own, next to the others' sent and read in turn.)
func TestQuorumFirstNodeStalled(t *testing.T) {
	servers := startServers(t, 3)
	m := quorumMutex(t, "redigo", servers, "first", WithNodeTimeout(100*time.Millisecond), WithOutageWindow(0))
	mustLock(t, m) // warm up: scripts cached, connections open
	mustUnlock(t, m)
	servers[0].Pause()
	defer servers[0].Resume()
	for range 3 {
		var err error
		redistest.Within(t, 5*time.Second, "LockCtx with the first node stalled", func() { err = m.LockCtx(context.Background()) })
		if err != nil {
			t.Fatalf("LockCtx with the first node stalled: %v", err)
		}
		if h := holders(t, servers[1:], "first"); h != 2 {
			t.Fatalf("lock key on %d of the 2 live servers, want 2", h)
		}
		if err := m.UnlockCtx(context.Background()); err != nil {
			t.Fatalf("UnlockCtx with the first node stalled: %v", err)
		}
		if h := holders(t, servers[1:], "first"); h != 0 {
			t.Fatalf("lock key left on %d live servers after UnlockCtx", h)
		}
	}
}

func TestQuorumMajorityDown(t *testing.T) {
	servers := startServers(t, 5)
	m := quorumMutex(t, "redigo", servers, "majority", WithNodeTimeout(200*time.Millisecond), WithOutageWindow(time.Second))
	mustLock(t, m) // warm up: scripts cached, connections open
	mustUnlock(t, m)
	servers[0].Kill()
	servers[2].Pause()
	servers[4].Pause()
	var err error
	redistest.Within(t, 5*time.Second, "LockCtx with a majority down", func() { err = m.LockCtx(context.Background()) })
	if !errors.Is(err, ErrQuorum) {
		t.Fatalf("LockCtx: got %v, want ErrQuorum", err)
	}
	for _, node := range []string{"node 0", "node 2", "node 4"} {
		if !strings.Contains(err.Error(), node) {
			t.Errorf("error %q does not name %s", err, node)
		}
	}
	if strings.Contains(err.Error(), "node 1") || strings.Contains(err.Error(), "node 3") {
		t.Errorf("error %q names a node that answered", err)
	}
	if h := holders(t, []*redistest.Server{servers[1], servers[3]}, "majority"); h != 0 {
		t.Errorf("lock key left on %d live servers", h)
	}
	servers[2].Resume()
	servers[4].Resume()
	settlesFree(t, servers[1:], "majority")
}

// One node held by a foreign value, one stalled, the caller's ctx
// cancelled mid-acquire. After return, and after the stalled node resumes and
// runs our delayed request, no node holds our value.
func TestQuorumCancelledWithStalledNode(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			servers := startServers(t, 3)
			m := quorumMutex(t, client, servers, "stall", WithNodeTimeout(2*time.Second))
			// Warm up: with the scripts cached, the delayed EVALSHA will run
			// (on a cold server it would fail with NOSCRIPT and prove nothing).
			mustLock(t, m)
			mustUnlock(t, m)
			if _, err := servers[0].Do("SET", "netlock:{stall}", "foreign", "PX", "60000"); err != nil {
				t.Fatal(err)
			}
			servers[1].Pause()
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			var err error
			redistest.Within(t, 10*time.Second, "LockCtx", func() { err = m.LockCtx(ctx) })
			if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
				t.Fatalf("LockCtx: got %v, want ErrNotObtained and context.Canceled", err)
			}
			if v, _ := servers[0].Do("GET", "netlock:{stall}"); v != "foreign" {
				t.Errorf("foreign value on node 0: got %q, want it untouched", v)
			}
			if h := holders(t, servers[2:], "stall"); h != 0 {
				t.Error("node 2 still holds our value after LockCtx returned")
			}
			servers[1].Resume()
			settlesFree(t, servers[1:], "stall")
		})
	}
}

// A caller whose ctx ends before a quorum forms never gets nil,
// even if the grants arrive afterwards.
func TestQuorumDeadlineBeforeQuorum(t *testing.T) {
	servers := startServers(t, 3)
	m := quorumMutex(t, "redigo", servers, "late", WithNodeTimeout(2*time.Second))
	mustLock(t, m) // warm up: scripts cached, connections open
	mustUnlock(t, m)
	servers[0].Pause()
	servers[1].Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	time.AfterFunc(90*time.Millisecond, func() { // grants arrive around the deadline
		servers[0].Resume()
		servers[1].Resume()
	})
	err := m.LockCtx(ctx)
	if err == nil {
		// A quorum formed before the deadline: legitimate, but then the
		// hold must be real.
		if h := holders(t, servers, "late"); h < 2 {
			t.Fatalf("LockCtx returned nil with the key on %d servers", h)
		}
		mustUnlock(t, m)
		return
	}
	// Two of three nodes did not answer in time: an outage, not a lock
	// held by another.
	if !errors.Is(err, ErrQuorum) || errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockCtx: got %v, want nil or ErrQuorum with DeadlineExceeded, not ErrNotObtained", err)
	}
	if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("UnlockCtx after a failed LockCtx: got %v, want ErrNotHeld", err)
	}
	settlesFree(t, servers, "late")
}

// A slow node that applies our SET after our deadline never
// strands the key.
func TestSlowNodeAppliesLate(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			servers := startServers(t, 1)
			m := quorumMutex(t, client, servers, "slow", WithNodeTimeout(100*time.Millisecond))
			mustLock(t, m) // warm up: scripts cached, connections open
			mustUnlock(t, m)
			servers[0].Pause()
			err := m.LockCtx(context.Background())
			if !errors.Is(err, ErrQuorum) {
				t.Fatalf("LockCtx on a stalled node: got %v, want ErrQuorum", err)
			}
			servers[0].Resume()
			settlesFree(t, servers, "slow")
			mustLock(t, m) // and the lock works again
			mustUnlock(t, m)
		})
	}
}

// Extend after the keys expired, with the lock taken and released
// by another client meanwhile, reports ErrLockLost and never re-acquires.
func TestExtendAfterExpiryIsLost(t *testing.T) {
	servers := startServers(t, 3)
	a := quorumMutex(t, "redigo", servers, "lapse", WithExpiry(time.Second), WithAutoExtend(false))
	b := quorumMutex(t, "rueidis", servers, "lapse")
	mustLock(t, a)
	for _, s := range servers { // the keys expire (as after a long pause)
		if _, err := s.Do("PEXPIRE", "netlock:{lapse}", "1"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "the keys expired", func() bool { return holders(t, servers, "lapse") == 0 })
	mustLock(t, b)
	mustUnlock(t, b)
	if err := a.ExtendCtx(context.Background()); !errors.Is(err, ErrLockLost) {
		t.Errorf("ExtendCtx: got %v, want ErrLockLost", err)
	}
	select {
	case <-a.Lost():
	default:
		t.Error("Lost() open after ExtendCtx reported ErrLockLost")
	}
	if h := holders(t, servers, "lapse"); h != 0 {
		t.Errorf("extend re-created the key on %d servers", h)
	}
	if err := a.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
		t.Errorf("UnlockCtx: got %v, want ErrLockLost", err)
	}
}

// Fencing over a quorum: many acquisitions by several clients while a random
// minority of nodes is stopped, killed and restarted (with AOF, so counters
// survive): every holder's token is above the previous holder's.
func TestQuorumFencingUnderFaults(t *testing.T) {
	servers := startServers(t, 5, "--appendonly", "yes", "--appendfsync", "always")
	const clients, cycles = 4, 20
	ms := make([]*NetMutex, clients)
	libs := testClients()
	for i := range ms {
		client := libs[i%len(libs)]
		ms[i] = quorumMutex(t, client, servers, "fenced", WithNodeTimeout(100*time.Millisecond), WithExpiry(2*time.Second))
	}
	var mu sync.Mutex
	var tokens []uint64
	var violations, acquisitions, failures int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				err := m.LockCtx(ctx)
				cancel()
				if err != nil {
					// A fault window (a restarted node without its scripts,
					// a node timing out): errors are allowed, a wrong token
					// is not.
					mu.Lock()
					failures++
					mu.Unlock()
					continue
				}
				mu.Lock()
				if n := len(tokens); n > 0 && m.Token() <= tokens[n-1] {
					violations++
				}
				tokens = append(tokens, m.Token())
				acquisitions++
				mu.Unlock()
				time.Sleep(time.Millisecond) // the section's length
				m.UnlockCtx(context.Background())
			}
		})
	}
	// Faults on a minority (one or two nodes at a time), from the test
	// goroutine as redistest requires.
	rng := rand.New(rand.NewPCG(1, 2))
	faults := map[string]int{}
	for range cycles {
		victims := rng.Perm(5)[:1+rng.IntN(2)]
		kind := []string{"pause", "kill"}[rng.IntN(2)]
		for _, v := range victims {
			if kind == "pause" {
				servers[v].Pause()
			} else {
				servers[v].Kill()
			}
			faults[kind]++
		}
		time.Sleep(time.Duration(50+rng.IntN(150)) * time.Millisecond) // the fault's length
		for _, v := range victims {
			if kind == "pause" {
				servers[v].Resume()
			} else {
				servers[v].Restart()
			}
		}
		time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond) // the time between faults
	}
	close(stop)
	wg.Wait()
	t.Logf("%d acquisitions, %d failed attempts, faults %v, token violations %d", acquisitions, failures, faults, violations)
	if violations != 0 {
		t.Errorf("%d holders got a token not above the previous holder's", violations)
	}
	if acquisitions < 50 {
		t.Errorf("only %d acquisitions with at most a minority down", acquisitions)
	}
}
