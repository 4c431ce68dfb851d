package netlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/goredis"
	"github.com/netlock-go/netlock/internal/redistest"
)

// sentinelSoakEnv turns TestSentinelFailover into a longer run: three
// sentinels, both settings of WithSyncReplicas, and six failovers of each
// kind.
const sentinelSoakEnv = "NETLOCK_SENTINEL_SOAK"

// sentinelWorkers contend on one lock, each with a NetMutex on a client of
// its own.
const sentinelWorkers = 4

// Kinds of failover.
const (
	forced = "SENTINEL FAILOVER" // the sentinels promote a replica while the primary still runs
	killed = "SIGKILL"           // the primary dies; the sentinels agree it is down and promote a replica
)

// TestSentinelFailover: clients contend on one lock of a primary with two
// replicas, watched by redis-sentinel, while Sentinel fails the primary
// over, and the test counts holds lost (Lost fired, or Unlock found the lock
// gone), overlaps (two critical sections at once) and fencing tokens not
// above the highest seen before. The short run makes one forced failover
// with WithSyncReplicas(1); with NETLOCK_SENTINEL_SOAK=1, six forced
// failovers and, apart, six SIGKILLs of the primary (restarted empty, as a
// replica), with and without the option. It asserts that locking goes on
// after every failover and that tokens increase before the first, and
// reports the counts: WAIT does not make a failover keep every
// acknowledged write (see WithSyncReplicas), so they are not asserted.
//
// redigo has no Sentinel support: a pool dials one address.
func TestSentinelFailover(t *testing.T) {
	settings, kinds, rounds, sentinels := []int{1}, []string{forced}, 1, 1
	if os.Getenv(sentinelSoakEnv) != "" {
		settings, kinds, rounds, sentinels = []int{0, 1}, []string{forced, killed}, 6, 3
	}
	for _, kind := range kinds {
		for _, client := range []string{"rueidis", "goredis"} {
			for _, replicas := range settings {
				t.Run(fmt.Sprintf("%s/%s/replicas=%d", kind, client, replicas), func(t *testing.T) {
					sentinelRun(t, client, replicas, kind, rounds, sentinels)
				})
			}
		}
	}
}

// sentinelCounts are what the workers of one run saw. Tokens that did not
// increase are counted apart before and after the first failover.
type sentinelCounts struct {
	acquired, lost, overlaps, errs atomic.Int64
	failedOver                     atomic.Bool
	regressions                    [2]atomic.Int64 // before, after the first failover
}

func sentinelRun(t *testing.T, client string, replicas int, kind string, rounds, sentinels int) {
	redistest.RequireSentinel(t)
	const master = "netlock"
	// Every server may become the primary, and then syncs its replicas
	// through a file: a diskless sync would first wait 5s for more of
	// them, and WAIT would count none meanwhile.
	noDiskless := []string{"--repl-diskless-sync", "no"}
	p := redistest.Start(t, noDiskless...)
	servers := map[string]*redistest.Server{p.Addr(): p}
	for range 2 {
		r := redistest.StartReplica(t, p.Addr(), noDiskless...)
		servers[r.Addr()] = r
	}
	s := redistest.StartSentinels(t, sentinels, master, p.Addr(), 2)

	var c sentinelCounts
	var inside atomic.Int32
	var tokenMu sync.Mutex
	var lastToken uint64
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range sentinelWorkers {
		m, err := netlock.New("sentinel", []netlock.Backend{sentinelBackend(t, client, s.Addrs(), master)},
			netlock.WithSyncReplicas(replicas), netlock.WithExpiry(2*time.Second),
			netlock.WithOutageWindow(10*time.Second), netlock.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
			for ctx.Err() == nil {
				lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				err := m.LockCtx(lctx)
				cancel()
				if err != nil {
					if ctx.Err() == nil {
						c.errs.Add(1)
						time.Sleep(10 * time.Millisecond) // a pause before the next try
					}
					continue
				}
				c.acquired.Add(1)
				if inside.Add(1) > 1 {
					c.overlaps.Add(1)
				}
				tokenMu.Lock()
				if tok := m.Token(); tok <= lastToken {
					after := 0
					if c.failedOver.Load() {
						after = 1
					}
					c.regressions[after].Add(1)
				} else {
					lastToken = tok
				}
				tokenMu.Unlock()
				lost := m.Lost()
				timer.Reset(rand.N(50 * time.Millisecond)) // the critical section
				select {
				case <-timer.C:
				case <-lost:
					timer.Stop()
				}
				inside.Add(-1)
				select {
				case <-lost:
					c.lost.Add(1)
					m.UnlockCtx(context.Background())
				default:
					if err := m.UnlockCtx(context.Background()); errors.Is(err, netlock.ErrLockLost) {
						c.lost.Add(1)
					}
				}
			}
		})
	}
	defer func() {
		stop()
		wg.Wait()
	}()

	// progress waits for more acquisitions, failing the test if locking
	// has not gone on.
	progress := func(what string) {
		t.Helper()
		before := c.acquired.Load()
		deadline := time.Now().Add(20 * time.Second)
		for c.acquired.Load() < before+2*sentinelWorkers {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d acquisitions in 20s, want %d", what, c.acquired.Load()-before, 2*sentinelWorkers)
			}
			time.Sleep(10 * time.Millisecond) // between looks at the count
		}
	}
	progress("before any failover")
	primary := p.Addr()
	for round := range rounds {
		c.failedOver.Store(true)
		old := primary
		if kind == forced {
			// Sentinel refuses while a failover is under way, or until
			// it counts a replica as good again: asked every 100ms.
			for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
				err := s.Failover()
				if err == nil {
					break
				}
				if time.Since(start) > 20*time.Second {
					t.Fatalf("round %d: SENTINEL FAILOVER: %v", round, err)
				}
			}
		} else {
			servers[old].Kill()
		}
		next, err := s.WaitPrimary(old, 30*time.Second)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		primary = next
		if kind == killed {
			// It comes back empty, and Sentinel makes it a replica.
			servers[old].Restart()
		}
		progress(fmt.Sprintf("round %d, after a %s", round, kind))
	}
	stop()
	wg.Wait()
	redistest.Report(t, "%s, WithSyncReplicas(%d), %d sentinels, %d × %s: %d acquisitions, %d holds lost, %d overlaps, "+
		"%d tokens not above the highest seen before, %d LockCtx errors",
		client, replicas, sentinels, rounds, kind, c.acquired.Load(), c.lost.Load(), c.overlaps.Load(),
		c.regressions[1].Load(), c.errs.Load())
	if n := c.regressions[0].Load(); n > 0 {
		t.Errorf("%d fencing tokens did not increase before any failover", n)
	}
}

// sentinelBackend returns a Backend on a Sentinel client of its own,
// closed when the test ends.
func sentinelBackend(t *testing.T, client string, sentinels []string, master string) netlock.Backend {
	t.Helper()
	switch client {
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:  sentinels,
			Sentinel:     rueidis.SentinelOption{MasterSet: master},
			DisableCache: true,
		})
		if err != nil {
			t.Fatalf("rueidis sentinel client: %v", err)
		}
		t.Cleanup(c.Close)
		return netlock.NewRueidis(c)
	case "goredis":
		c := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            master,
			SentinelAddrs:         sentinels,
			ContextTimeoutEnabled: true,
		})
		t.Cleanup(func() { c.Close() })
		return goredis.New(c)
	}
	t.Fatalf("no Sentinel client %q", client)
	return nil
}
