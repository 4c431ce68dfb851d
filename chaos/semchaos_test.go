package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/chaos/internal/toxi"
	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

const (
	semName = "chaos-sem"
	semSize = 3
	// semMostPermits is the most permits a goroutine acquires at once.
	semMostPermits = 2
	// semGoroutines is how many goroutines of each client acquire.
	semGoroutines = 3
)

// TestChaosSem runs eight clients, each a process of its own (its own
// connections, by default three redigo, three rueidis, two go-redis,
// through a toxiproxy of its own), each with one Semaphore of size semSize
// on the same name on one redis-server (a Semaphore runs on one backend; AOF,
// fsync always, as TestChaosSingle's), and semGoroutines goroutines each
// acquiring 1 or 2 permits (Acquire with a timeout; one in eight a
// TryAcquireCtx), writing to a resource a few times over a few
// milliseconds (one section in 32: up to 1.25 expiries), checking Lost() before each write and stopping if it
// closed, and releasing. The faults are TestChaosSingle's (runFaults: kill
// and restart, pause, latency, blackhole, reset, each hitting the server,
// with quiet times between them), with client stalls in critical sections.
//
// A killed server restarts from its AOF with the leases (their deadlines
// are scores in server time, absolute) after the expiry, when every lease
// on it has lapsed by its local clock, as TestChaosSingle describes for a
// NetMutex's keys.
//
// The history is checked by checkSemHistory: a hold counts its permits from
// Acquire returning to the end of its section, its lease's local deadline
// (as a semRecorder computes it from the client's calls) or Lost() closing,
// whichever is first; at no instant may more than semSize be out; Lost()
// closes in time. Once a fault has cleared, semMostPermits permits may not
// stay free while goroutines wait (checkFreed). Once the clients stop, no live lease may stay (within
// strandedGrace), and no key of the semaphore (within three expiries, the
// life of a waiter's place). Errors must be the documented sentinels.
//
// It runs chaosCI by default, or for NETLOCK_SOAK.
func TestChaosSem(t *testing.T) {
	s := chaosSetup{
		nodes:   1,
		victims: func(*rand.Rand) []int { return []int{0} },
		quiet:   func(rng *rand.Rand) time.Duration { return chaosQuiet + time.Duration(rng.Int64N(int64(chaosQuiet))) },
	}
	duration := chaosDuration(t)
	t.Cleanup(func() { waitNetlockDone(t, 5*time.Second) })
	servers := startServers(t, 1, serverArgs...)
	x := toxi.New(t)
	links := make([][]*toxi.Proxy, chaosClients) // [client][node]
	for i := range links {
		links[i] = []*toxi.Proxy{x.Proxy(servers[0].Addr())}
	}
	recs := make([]*semRecorder, chaosClients)
	sems := make([]*netlock.Semaphore, chaosClients)
	for i := range sems {
		recs[i] = newSemRecorder(i, chaosExpiry, chaosDrift)
		b := recs[i].wrap(newBackend(t, chaosClient(t, i), links[i][0].Addr()))
		sem, err := netlock.NewSemaphore(semName, semSize, []netlock.Backend{b}, netlock.WithExpiry(chaosExpiry),
			netlock.WithNodeTimeout(100*time.Millisecond), netlock.WithDriftFactor(chaosDrift),
			netlock.WithRetryDelay(time.Millisecond, 20*time.Millisecond),
			netlock.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		sems[i] = sem
	}

	var (
		resource  semResource
		mu        sync.Mutex // guards holds, gaveUp, errs
		holds     []semHold
		gaveUp    []semHold // Acquires that failed: a0, and their return as start and release
		errs      = map[string]int{}
		stalls    atomic.Int64
		tryMisses atomic.Int64
		longs     atomic.Int64 // long sections
		stallEps  stallEpisodes
	)
	count := func(what string, err error) {
		mu.Lock()
		errs[what+": "+errKind(err)]++
		mu.Unlock()
	}
	stall := make([]atomic.Bool, chaosClients)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var probe stallProbe
	wg.Go(func() { probe.run(ctx) })
	start := time.Now()
	counter := &semCounter{start: start}
	wg.Go(func() { counter.run(ctx, servers[0].Addr(), semSize) })
	for i, sem := range sems {
		for g := range semGoroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i*16+g), uint64(time.Now().UnixNano())))
				for ctx.Err() == nil {
					time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					n := int64(1 + rng.IntN(semMostPermits))
					actx, cancel := context.WithTimeout(ctx, time.Duration(200+rng.IntN(1800))*time.Millisecond)
					var err error
					ok, try, a0 := true, rng.IntN(8) == 0, time.Now()
					if try {
						ok, err = sem.TryAcquireCtx(actx, n)
					} else {
						err = sem.Acquire(actx, n)
					}
					cancel()
					if err != nil {
						count("acquire", err)
						if !try {
							// Permits handed to it as it gave up were
							// passed on within Acquire (see resolveSem).
							now := time.Now()
							mu.Lock()
							gaveUp = append(gaveUp, semHold{client: i, n: n, a0: a0, start: now, releaseStart: a0, releaseEnd: now})
							mu.Unlock()
						}
						continue
					}
					if !ok {
						tryMisses.Add(1)
						continue
					}
					h := semHold{client: i, n: n, try: try, a0: a0, start: time.Now()}
					lost := sem.Lost()
					h.validAtStart = isOpen(lost)
					released := make(chan struct{})
					watched := make(chan struct{})
					go func() {
						defer close(watched)
						select {
						case <-lost:
						case <-released:
							if isOpen(lost) {
								return
							}
						}
						h.lostAt = time.Now()
					}()
					mu.Lock()
					id := len(holds)
					holds = append(holds, semHold{}) // filled in below
					mu.Unlock()

					// Most sections last a few milliseconds; one in
					// 32, up to 1.25 expiries, so that leases are
					// extended (and lost) under the faults.
					writes, gap := 1+rng.IntN(3), 2*time.Millisecond
					if rng.IntN(32) == 0 {
						writes, gap = 5+rng.IntN(20), 50*time.Millisecond
						longs.Add(1)
					}
					for w := range writes {
						if !isOpen(lost) {
							h.stopped = true
							break
						}
						resource.write(id)
						if w == 0 && stall[i].CompareAndSwap(true, false) {
							h.paused = true
							stalls.Add(1)
							from := time.Now()
							pauseClient(links[i], chaosExpiry*3/2+time.Duration(rng.IntN(500))*time.Millisecond, nil)
							stallEps.add(i, from, time.Now())
						}
						if w < writes-1 {
							time.Sleep(time.Duration(rng.Int64N(int64(gap))))
						}
					}
					h.end = time.Now()
					h.validAtEnd = isOpen(lost)
					h.releaseStart = time.Now()
					h.releaseErr = sem.ReleaseCtx(context.Background(), n)
					h.releaseEnd = time.Now()
					close(released)
					<-watched
					mu.Lock()
					holds[id] = h
					if h.releaseErr != nil {
						errs["release: "+errKind(h.releaseErr)]++
					}
					mu.Unlock()
				}
			})
		}
	}

	faults, timeline, episodes := runFaults(t, s, servers, links, stall, start, duration, time.Sleep)
	stop()
	stopping := time.Now()
	if !waitGroupWithin(&wg, 2*time.Minute) {
		t.Fatalf("clients still running 2 minutes after the end; goroutines:\n\n%s", allGoroutines())
	}
	stopped := time.Now()
	stranded := checkStrandedSem(t, servers[0], stopped)

	// Each hold's lease and its deadline, from the client's calls.
	unexpl, assoc := resolveSem(recs, holds, gaveUp)
	slack := func(from, to time.Time) time.Duration { return chaosSlack + probe.longest(from, to) }
	violations, fig := checkSemHistory(holds, resource.writes, semSize, slack)
	// Every goroutine waits whenever it does not hold (pausing at most 2ms
	// between its attempts, a failed or missed one included), and at most
	// semSize of the 24 hold: some always wait. Waiters are served in order
	// of arrival, so whichever comes first fits once semMostPermits are
	// free. The clients' stalls are faults here (see stallEpisodes).
	// After any fault, a place whose waiter gave up during it may be left
	// in Redis (its leave is not sent again), and a release grants it
	// permits nobody takes (a known defect: see knownDefects).
	freed, freedMax := checkFreed(semSpans(holds), semSize, semMostPermits, knownDefects(stallEps.with(episodes), faultKinds(t, s)...), start, stopping, slack)
	violations = append(violations, freed...)
	violations = append(violations, unexpl...)
	violations = append(violations, stranded...)
	overs, counted := counter.report()
	violations = append(violations, overs...)
	for _, e := range slices.Sorted(maps.Keys(errs)) {
		if strings.Contains(e, "UNDOCUMENTED") {
			violations = append(violations, fmt.Sprintf("%d times %s", errs[e], e))
		}
	}
	var leases, leasesLost, grants, extends int
	lostLease, usedLease := map[*semLease]bool{}, map[*semLease]bool{}
	for _, h := range holds {
		usedLease[h.lease] = true
		if h.lease != nil && (!h.validAtEnd || !h.validAtStart) {
			lostLease[h.lease] = true
		}
	}
	for _, r := range recs {
		for _, l := range r.leases {
			if l.grants == 0 && !usedLease[l] {
				continue // an adoption that may not have been
			}
			leases++
			grants += l.grants
			extends += l.extends
		}
	}
	leasesLost = len(lostLease)
	two := 0
	for _, h := range holds {
		if h.n == 2 {
			two++
		}
	}
	mix := map[string]int{}
	for i := range chaosClients {
		mix[chaosClient(t, i)]++
	}
	figures := fmt.Sprintf("%v, %d clients %v × %d goroutines on 1 server, size %d: %d acquisitions (%d of 2 permits, %d long), %d try misses, %d writes; %d holds lost (%d stopped early by Lost(), %d lost at once), on %d of %d leases (%d grants, %d extends); holds explained by a grant %d, by an adoption %d (%d possible adoptions, %d folded), by a hand-on %d, ambiguous %d, unexplained %d; max concurrent permits %d; latest Lost() %v after the deadline, %d writes after a hold's valid end (longest process stall %v); stranded after the fault cleared: max %v (bound %v); faults %v, client stalls %d; errors %v; clients stopped in %v; violations %d",
		stopping.Sub(start).Round(time.Second), chaosClients, mix, semGoroutines, semSize, fig.holds, two, longs.Load(), tryMisses.Load(), len(resource.writes),
		fig.lost, fig.stopped, fig.invalidAtStart, leasesLost, leases, grants, extends, assoc.byGrant, assoc.byAdoption, assoc.adoptions, assoc.folded, assoc.byHandOn, assoc.ambiguous, assoc.unexplained, fig.maxPermits,
		fig.maxLate.Round(time.Millisecond), fig.writesLate, probe.longest(start, stopped).Round(time.Millisecond),
		freedMax.Round(time.Millisecond), freedBound, faults, stalls.Load(), errs, stopped.Sub(stopping).Round(time.Millisecond), len(violations))
	redistest.Report(t, "%s; %s", figures, counted)
	for i, v := range violations {
		if i == 20 {
			t.Errorf("... and %d more", len(violations)-i)
			break
		}
		t.Error(v)
	}
	if len(violations) > 0 {
		logViolatedSem(t, violations, holds, recs, start, timeline)
		counter.logCalls(t, recs)
	}
	if fig.holds < 10 {
		t.Errorf("only %d acquisitions: the semaphore made no progress between the faults", fig.holds)
	}
}

// checkStrandedSem looks at the semaphore's keys on the server, every
// client having stopped (at stopped) and every fault over: within
// strandedGrace no lease may be live (a release a fault kept back is sent
// again in the background; a lease whose process holds nothing is no
// longer extended); within three expiries more (a waiter's place, the TTL
// the scripts keep on the keys), no key may be left.
func checkStrandedSem(t *testing.T, s *redistest.Server, stopped time.Time) (violations []string) {
	t.Helper()
	k := keyspace.Sem(netlock.DefaultPrefix, semName)
	for {
		now, err := s.Do("TIME")
		if err != nil {
			return append(violations, fmt.Sprintf("every client stopped: %v", err))
		}
		f := strings.Fields(now)
		sec, _ := strconv.ParseInt(f[0], 10, 64)
		us, _ := strconv.ParseInt(f[1], 10, 64)
		live, err := s.Do("ZRANGEBYSCORE", k.Leases, "("+strconv.FormatInt(sec*1000+us/1000, 10), "+inf", "WITHSCORES")
		if err != nil {
			return append(violations, fmt.Sprintf("every client stopped: %v", err))
		}
		if live == "" {
			break
		}
		if since := time.Since(stopped); since >= strandedGrace {
			permits, _ := s.Do("HGETALL", k.Permits)
			violations = append(violations, fmt.Sprintf("live leases %q (permits %q) %v after every client stopped: stranded",
				strings.ReplaceAll(live, "\n", " "), strings.ReplaceAll(permits, "\n", " "), since.Round(time.Millisecond)))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	bound := 3*chaosExpiry + strandedGrace
	for _, key := range []string{k.Leases, k.Permits, k.Queue, k.Places, k.Wants} {
		for {
			n, err := s.Do("EXISTS", key)
			if err != nil {
				return append(violations, fmt.Sprintf("every client stopped: %v", err))
			}
			if n == "0" {
				break
			}
			if since := time.Since(stopped); since >= bound {
				pttl, _ := s.Do("PTTL", key)
				violations = append(violations, fmt.Sprintf("%s still there %v after every client stopped (TTL %sms)", key, since.Round(time.Millisecond), pttl))
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return violations
}

// logViolatedSem logs, for the holds that violations name, what the client
// saw (times from the start of the run) and its calls from a little before
// the hold's Acquire to a little after its release, and the faults.
func logViolatedSem(t *testing.T, violations []string, holds []semHold, recs []*semRecorder, start time.Time, timeline []string) {
	t.Helper()
	at := func(tm time.Time) string {
		if tm.IsZero() {
			return "-"
		}
		return tm.Sub(start).Round(time.Microsecond).String()
	}
	seen := map[int]bool{}
	for _, v := range violations {
		for _, sub := range holdRef.FindAllStringSubmatch(v, -1) {
			i, err := strconv.Atoi(sub[1])
			if err != nil || i >= len(holds) || seen[i] {
				continue
			}
			seen[i] = true
			h := &holds[i]
			lease := "-"
			if h.lease != nil {
				lease = fmt.Sprintf("%.8s (%d grants, %d extends, adopted %q, made %s, ambiguous %v)", h.lease.value, h.lease.grants, h.lease.extends,
					h.lease.adopted, at(h.lease.made), h.ambiguous)
			}
			t.Logf("hold %d: client %d (%s), %d permits on lease %s: try %v, called %s, start %s (valid %v), end %s (valid %v, stopped %v), until %s, Lost() %s, release %s: %v, paused %v",
				i, h.client, chaosClient(t, h.client), h.n, lease, h.try, at(h.a0), at(h.start), h.validAtStart, at(h.end), h.validAtEnd, h.stopped,
				at(h.until), at(h.lostAt), at(h.releaseStart), h.releaseErr, h.paused)
			r := recs[h.client]
			r.mu.Lock()
			calls := slices.Clone(r.calls)
			r.mu.Unlock()
			from, to := h.a0.Add(-100*time.Millisecond), h.releaseStart.Add(100*time.Millisecond)
			calls = slices.DeleteFunc(calls, func(c *semCall) bool { return c.end.Before(from) || c.start.After(to) })
			if len(calls) > 60 {
				t.Logf("  client %d: %d calls before these", h.client, len(calls)-60)
				calls = calls[len(calls)-60:] // the latest, where the grant is
			}
			for _, c := range calls {
				t.Logf("  client %d: %s %s-%s %s: %v %v", h.client, c.script, at(c.start), at(c.end), c.arg, c.vals, c.err)
			}
		}
	}
	for _, v := range violations {
		if strings.Contains(v, "stranded") {
			logStrandedSem(t, v, recs, at)
		}
	}
	for _, f := range timeline {
		t.Logf("fault %s", f)
	}
}

// logStrandedSem logs the latest calls, of any client, on the leases that
// violation v names as stranded.
func logStrandedSem(t *testing.T, v string, recs []*semRecorder, at func(time.Time) string) {
	t.Helper()
	for _, r := range recs {
		r.mu.Lock()
		calls := slices.DeleteFunc(slices.Clone(r.calls), func(c *semCall) bool { return c.value == "" || !strings.Contains(v, c.value) })
		r.mu.Unlock()
		if len(calls) > 20 {
			calls = calls[len(calls)-20:]
		}
		for _, c := range calls {
			t.Logf("  client %d (stranded lease): %s %s-%s %s: %v %v", r.client, c.script, at(c.start), at(c.end), c.arg, c.vals, c.err)
		}
	}
}
