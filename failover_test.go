package netlock

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// failoverTrialsEnv sets how many trials TestFailover makes per link delay
// and setting, for a soak run (NETLOCK_FAILOVER_TRIALS=200); the default is
// a short run for CI.
const failoverTrialsEnv = "NETLOCK_FAILOVER_TRIALS"

const defaultFailoverTrials = 5

// TestFailover: does a lock acknowledged by a primary survive a failover?
// Each trial starts a primary P and a replica R whose replication link
// goes through a proxy that delays P's bytes to R (a replication lag). A
// client acquires a lock on P; as soon as LockCtx returns, the link is cut
// (the proxy closed: what was still on its way to R is lost) and P killed
// (SIGKILL), R is promoted (REPLICAOF NO ONE), and the test looks for the
// acknowledged lock, with our value and token, on R. The trials take turns
// over the client libraries of testClients.
//
// With WithSyncReplicas(1) no acknowledged lock may be missing; without it
// the test reports how many were (replication is asynchronous: at a delay
// of a few milliseconds, nearly all), asserting nothing about that count.
func TestFailover(t *testing.T) {
	trials := defaultFailoverTrials
	if v := os.Getenv(failoverTrialsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive number of trials", failoverTrialsEnv, v)
		}
		trials = n
	}
	clients := testClients()
	for _, delay := range []time.Duration{0, 2 * time.Millisecond} {
		for _, replicas := range []int{0, 1} {
			t.Run(fmt.Sprintf("delay=%v/replicas=%d", delay, replicas), func(t *testing.T) {
				missing := 0
				for i := range trials {
					client := clients[i%len(clients)]
					t.Run(fmt.Sprintf("%d/%s", i, client), func(t *testing.T) {
						if !failoverKeeps(t, client, delay, replicas) {
							missing++
							if replicas > 0 {
								t.Errorf("with WithSyncReplicas(%d), the acknowledged lock is missing on the promoted replica", replicas)
							}
						}
					})
				}
				redistest.Report(t, "replication link delay %v, WithSyncReplicas(%d): %d of %d acknowledged locks missing on the promoted replica",
					delay, replicas, missing, trials)
			})
		}
	}
}

// failoverKeeps makes one trial of TestFailover and reports whether the
// promoted replica has the lock that LockCtx acknowledged.
func failoverKeeps(t *testing.T, client string, delay time.Duration, replicas int) bool {
	p := redistest.Start(t)
	link := redistest.StartProxy(t, p.Addr())
	link.SetReplyDelay(delay)
	r := redistest.StartReplica(t, link.Addr())
	m, err := New("failover", []Backend{newBackend(t, client, p.Addr())},
		WithSyncReplicas(replicas), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	mustLock(t, m)
	want := heldValue(m)
	// The link is cut first: Kill waits for the process to exit, a few
	// milliseconds during which the proxy would still deliver what was due.
	// A crash loses what is on its way at once.
	link.Close()
	p.Kill()
	if _, err := r.Do("REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatalf("promote the replica: %v", err)
	}
	got, err := r.Do("GET", m.keys.lock)
	if err != nil {
		t.Fatalf("GET on the promoted replica: %v", err)
	}
	// The primary is gone: the release fails, and with a refused
	// connection the reaper does not keep it.
	m.UnlockCtx(context.Background())
	return got == want
}
