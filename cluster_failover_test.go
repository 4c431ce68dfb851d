package netlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// soakEnv, set to a duration (10m), makes TestClusterFailover repeat its
// failovers for that long, as it does the chaos tests' (package chaos).
const soakEnv = "NETLOCK_SOAK"

// A Redis Cluster fails over while NetMutexes on rueidis and go-redis
// cluster clients of their own contend for locks on every shard: first a
// replica takes over its master by CLUSTER FAILOVER (coordinated: no write
// is lost), then a master is killed (SIGKILL) and its replica takes over
// once cluster-node-timeout has passed. Every waiter recovers (each LockCtx
// succeeds: its watch fails with the master's connection, or by the
// sunsubscribe a master sends when its slots leave it, and it watches again
// on the new master), no PUBLISH runs anywhere, and once all have unlocked
// no lock key is left. Holds lost, overlapping critical sections and
// fencing tokens that went back are reported: without WAIT, the writes the
// killed master had not yet sent to its replica are lost with it, so a
// failover may lose a hold (and let another client in before its holder
// learns of it) or a fence counter's last increments.
func TestClusterFailover(t *testing.T) {
	rows := []struct {
		name string
		opts []Option
		// safe: tokens never go back and critical sections never overlap,
		// across the failovers; false where a lost write may do either.
		safe bool
	}{
		{"async", nil, false},
		// With WAIT, every hold and fence increment a client was told of
		// is on the replica that takes over.
		{"syncReplicas", []Option{WithSyncReplicas(1)}, true},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) { testClusterFailover(t, r.opts, r.safe) })
	}
}

func testClusterFailover(t *testing.T, rowOpts []Option, safe bool) {
	cluster := redistest.StartClusterReplicas(t, 3, 1, "--cluster-node-timeout", "1000")
	// Runs after the clients, registered later, are closed.
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	names := namesOnEveryMaster(t, cluster, "failover")
	// A short expiry, so that a lost hold is found (and its key expires)
	// soon; an outage window that outlasts a failover.
	opts := append([]Option{WithExpiry(3 * time.Second), WithOutageWindow(30 * time.Second)}, rowOpts...)

	type lockStats struct {
		inside, overlaps atomic.Int32
		mu               sync.Mutex
		tokens           []uint64 // in the order the critical sections began
	}
	stats := map[string]*lockStats{}
	for _, name := range names {
		stats[name] = &lockStats{}
	}
	type worker struct {
		kind, name string
		m          *NetMutex
		rounds     atomic.Int64
	}
	var workers []*worker
	const clientsPerKind = 2
	for _, kind := range clusterKinds() {
		for range clientsPerKind {
			b := clusterBackend(t, kind, cluster)
			for _, name := range names {
				workers = append(workers, &worker{kind: kind, name: name, m: newTestMutex(t, name, b, opts...)})
			}
		}
	}
	var stop atomic.Bool
	var lost, unlockErrs, notReplicated atomic.Int64
	var wg sync.WaitGroup
	for _, w := range workers {
		st := stats[w.name]
		wg.Go(func() {
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				err := w.m.LockCtx(ctx)
				cancel()
				if errors.Is(err, ErrNotReplicated) {
					// A master without its replica yet (the killed one
					// not back): refused, not held. Try again.
					notReplicated.Add(1)
					time.Sleep(50 * time.Millisecond) // a pause before the next try, not an ordering
					continue
				}
				if err != nil {
					t.Errorf("%s, %s, round %d: LockCtx: %v", w.kind, w.name, w.rounds.Load(), err)
					return
				}
				st.mu.Lock()
				st.tokens = append(st.tokens, w.m.Token())
				st.mu.Unlock()
				if st.inside.Add(1) != 1 {
					st.overlaps.Add(1)
				}
				time.Sleep(2 * time.Millisecond) // the critical section's length
				st.inside.Add(-1)
				switch err := w.m.UnlockCtx(context.Background()); {
				case err == nil:
				case errors.Is(err, ErrLockLost):
					lost.Add(1)
				default:
					unlockErrs.Add(1) // the reaper delivers it
				}
				w.rounds.Add(1)
				time.Sleep(5 * time.Millisecond) // contention, not a busy loop
			}
		})
	}
	defer func() {
		stop.Store(true)
		redistest.Within(t, 2*time.Minute, "the workers' last rounds", wg.Wait)
	}()
	// progress waits until every worker has locked n more times.
	progress := func(n int64, what string) {
		t.Helper()
		base := make([]int64, len(workers))
		for i, w := range workers {
			base[i] = w.rounds.Load()
		}
		eventually(t, time.Minute, fmt.Sprintf("every worker locking %d times %s", n, what), func() bool {
			for i, w := range workers {
				if w.rounds.Load() < base[i]+n {
					return false
				}
			}
			return true
		})
	}

	progress(1, "before the failovers")
	soak := soakDuration(t)
	start := time.Now()
	failovers := 0
	for i := 0; i == 0 || time.Since(start) < soak; i++ {
		name := names[i%len(names)]
		master := ownerServer(t, cluster, name)
		replica := replicaOf(t, cluster, master)
		if got, err := replica.Do("CLUSTER", "FAILOVER"); err != nil || got != "OK" {
			t.Fatalf("CLUSTER FAILOVER on %s: %q, %v", replica.Addr(), got, err)
		}
		awaitTakeover(t, cluster, replica, name)
		failovers++
		progress(2, "after CLUSTER FAILOVER on "+replica.Addr())

		name = names[(i+1)%len(names)]
		master = ownerServer(t, cluster, name)
		replica = replicaOf(t, cluster, master)
		master.Kill()
		awaitTakeover(t, cluster, replica, name)
		failovers++
		rejoin := func() {
			// Back as the new master's replica: for the next round, and,
			// with WithSyncReplicas, for its master to take locks again.
			master.Restart()
			eventually(t, 30*time.Second, master.Addr()+" linked to its master again", func() bool {
				info, err := master.Do("INFO", "replication")
				return err == nil && infoField(info, "master_link_status") == "up"
			})
		}
		if safe {
			rejoin()
		}
		progress(2, "after SIGKILL of master "+master.Addr())
		if soak > 0 && !safe {
			rejoin()
		}
	}
	stop.Store(true)
	redistest.Within(t, 2*time.Minute, "the workers' last rounds", wg.Wait)

	// Nothing stranded: every lock key goes, by the releases (the reaper
	// delivers those that failed) or, for a hold lost, by its TTL.
	check := newClusterClient(t, cluster)
	stranded := time.Now()
	eventually(t, 10*time.Second, "no lock key left", func() bool {
		for _, name := range names {
			if clusterInt(t, check, check.B().Exists().Key("netlock:{"+name+"}").Build()) != 0 {
				return false
			}
		}
		return true
	})
	gone := time.Since(stranded)
	queued := int64(0)
	for _, name := range names {
		queued += clusterInt(t, check, check.B().Zcard().Key("netlock:{"+name+"}:waiters").Build())
	}

	var rounds int64
	for _, w := range workers {
		rounds += w.rounds.Load()
	}
	var overlaps int32
	regressions := 0
	for _, name := range names {
		st := stats[name]
		overlaps += st.overlaps.Load()
		for j := 1; j < len(st.tokens); j++ {
			if st.tokens[j] <= st.tokens[j-1] {
				regressions++
			}
		}
	}
	publish, spublish := publishCalls(t, cluster)
	redistest.Report(t, "%d failovers (%v): %d workers on %d locks locked %d times; holds lost %d, unlocks failed %d, overlapping critical sections %d, tokens not above the previous %d; acquires refused as not replicated %d; last lock key gone %v after the last unlock, queue entries left %d; PUBLISH %d, SPUBLISH %d",
		failovers, time.Since(start).Round(time.Millisecond), len(workers), len(names), rounds, lost.Load(), unlockErrs.Load(), overlaps, regressions, notReplicated.Load(), gone.Round(time.Millisecond), queued, publish, spublish)
	if publish != 0 {
		t.Errorf("PUBLISH ran %d times on the cluster, want 0 (releases use SPUBLISH)", publish)
	}
	if safe && (overlaps != 0 || regressions != 0) {
		t.Errorf("overlapping critical sections %d, tokens not above the previous %d; want 0, 0", overlaps, regressions)
	}
}

// soakDuration returns how long TestClusterFailover repeats its failovers
// ($NETLOCK_SOAK); 0, for one round, when unset.
func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv(soakEnv)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 10m", soakEnv, v)
	}
	return d
}

// awaitTakeover waits until replica is the master serving lock name's keys
// and the cluster is healthy in its view.
func awaitTakeover(t testing.TB, cluster *redistest.Cluster, replica *redistest.Server, name string) {
	t.Helper()
	eventually(t, 30*time.Second, replica.Addr()+" taking over", func() bool {
		info, err := replica.Do("CLUSTER", "INFO")
		if err != nil || infoField(info, "cluster_state") != "ok" {
			return false
		}
		_, err = replica.Do("EXISTS", "netlock:{"+name+"}")
		return err == nil // not MOVED: it serves the slot
	})
}
