package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/chaos/internal/toxi"
	"github.com/netlock-go/netlock/internal/redistest"
)

// rwName is the NetRWMutex the RW chaos tests lock.
const rwName = "chaos-rw"

// rwClients is how many clients (processes) the RW chaos tests run.
const rwClients = chaosClients

// rwWriters and rwReaders are how many goroutines of client i write and
// read: odd clients run two writers and two readers (two local writers
// queue on one write lock), even ones one writer and three readers.
func rwWriters(i int) int { return 1 + i%2 }
func rwReaders(i int) int { return 3 - i%2 }

// rwReadFor is how long a reader of client i stays in its section: up to
// 3 ms for even clients; none for odd ones, whose read sections are then
// far shorter than a round trip, so that their readers read under their
// process's write lock while one of its writers holds or waits (see
// netlock.NetRWMutex) where the others take read leases.
func rwReadFor(i int, rng *rand.Rand) time.Duration {
	if i%2 == 1 {
		return 0
	}
	return time.Duration(rng.IntN(3000)) * time.Microsecond
}

// TestChaosRW is TestChaos for a NetRWMutex: eight clients, each a process
// of its own (its own connections, by default three redigo, three rueidis,
// two go-redis, through toxiproxies of their own), each with one
// NetRWMutex on the same name on five redis-servers (a quorum; AOF, fsync always), and
// goroutines writing and reading under it (rwWriters, rwReaders); one in
// eight of their attempts is a TryLockCtx or TryRLockCtx. The faults are
// TestChaos's, on a minority of the servers (runFaults), with client
// stalls in critical sections, write or read.
//
// A writer writes twice to a fenced resource (rwResource) with its token;
// a reader reads which write is the latest, as its section begins and as
// it ends. The history (write holds as TestChaos's; read sections with
// RLost() at their start and end; the read leases with their local
// deadlines, as an rwRecorder computes them from the client's calls, and
// when RLost() closed) is checked by checkRWHistory: no writer overlaps a
// writer or a reader, none of them reported lost; tokens strictly
// increase; a valid reader never sees the resource change, nor a token
// older than one granted before its read; Lost() and RLost() close in time.
// Once a fault has cleared, the lock may not stay free (nobody reading or
// writing) while clients wait for it (checkFreed). Once the clients stop,
// no key of the lock may keep anyone out (checkStrandedRW). Errors must be
// the documented sentinels.
//
// It runs chaosCI by default; NETLOCK_SOAK=10m runs it for ten minutes
// (add -timeout 30m). NETLOCK_CHAOS_SEED=N runs the faults of the run that
// logged "faults from seed N" again.
func TestChaosRW(t *testing.T) {
	runChaosRW(t, chaosSetup{
		nodes:   chaosNodes,
		victims: func(rng *rand.Rand) []int { return rng.Perm(chaosNodes)[:1+rng.IntN(2)] },
		quiet:   func(rng *rand.Rand) time.Duration { return time.Duration(rng.IntN(300)) * time.Millisecond },
	})
}

// TestChaosRWSingle is TestChaosRW on one redis-server, which every fault
// hits, with TestChaosSingle's quiet times between them.
//
// It runs chaosCI by default, or for NETLOCK_SOAK.
func TestChaosRWSingle(t *testing.T) {
	runChaosRW(t, chaosSetup{
		nodes:   1,
		victims: func(*rand.Rand) []int { return []int{0} },
		quiet:   func(rng *rand.Rand) time.Duration { return chaosQuiet + time.Duration(rng.Int64N(int64(chaosQuiet))) },
	})
}

// runChaosRW runs an RW chaos test as TestChaosRW describes it, with s's
// servers, victims and quiet times.
func runChaosRW(t *testing.T, s chaosSetup) {
	duration := chaosDuration(t)
	t.Cleanup(func() { waitNetlockDone(t, 5*time.Second) })
	servers := startServers(t, s.nodes, serverArgs...)
	x := toxi.New(t)
	links := make([][]*toxi.Proxy, rwClients) // [client][node]
	for i := range links {
		for _, srv := range servers {
			links[i] = append(links[i], x.Proxy(srv.Addr()))
		}
	}
	recs := make([]*rwRecorder, rwClients)
	trace := newEvalTrace()
	rws := make([]*netlock.NetRWMutex, rwClients)
	for i := range rws {
		recs[i] = newRWRecorder(chaosExpiry, chaosDrift)
		recs[i].trace, recs[i].client = trace, i
		backends := make([]netlock.Backend, s.nodes)
		for k := range servers {
			backends[k] = recs[i].wrap(newBackend(t, chaosClient(t, i), links[i][k].Addr()))
		}
		rw, err := netlock.NewRW(rwName, backends, netlock.WithExpiry(chaosExpiry), netlock.WithNodeTimeout(100*time.Millisecond),
			netlock.WithDriftFactor(chaosDrift), netlock.WithRetryDelay(time.Millisecond, 20*time.Millisecond),
			netlock.WithObserver(recs[i].observer()),
			netlock.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		rws[i] = rw
	}

	var (
		resource = newRWResource()
		mu       sync.Mutex // guards holds, reads, leases, errs and unexplained
		holds    []holdRecord
		reads    []readRecord
		leases   []leaseRecord
		// leaseTimings: each lease's timing, by its index in leases; its
		// deadline is read once every client has stopped, when the lease
		// is over and its timing final.
		leaseTimings = map[int]*leaseTiming{}
		errs         = map[string]int{}
		unexplained  []string
		stalls       atomic.Int64
		tryMisses    atomic.Int64 // TryLockCtx and TryRLockCtx that found rw taken
	)
	count := func(what string, err error) {
		mu.Lock()
		errs[what+": "+errKind(err)]++
		mu.Unlock()
	}
	stall := make([]atomic.Bool, rwClients)
	var stallTurn atomic.Int64 // even: a writer takes the next stall; odd: a reader
	ctx, stop := context.WithCancel(context.Background())
	var wg, watchers sync.WaitGroup
	var probe stallProbe
	wg.Go(func() { probe.run(ctx) })
	// The clients' goroutines, and those of them in a stall (their time is
	// the stall's, not netlock's).
	var running, inStall atomic.Int64
	var stallEnd atomic.Int64 // when the latest stall ended, ns since start
	start := time.Now()
	var stallEps stallEpisodes
	stalled := func(client int, pause func(ended func())) {
		inStall.Add(1)
		from := time.Now()
		// The stall ends when every link of the client delivers again
		// (see pauseClient).
		pause(func() {
			stallEnd.Store(int64(time.Since(start)))
			inStall.Add(-1)
			stallEps.add(client, from, time.Now())
		})
	}
	for i, rw := range rws {
		// The leases of client i, by their RLost() channel: a lease
		// handed from the last reader to a new one is the same hold, on
		// the same channel.
		leaseOf := map[<-chan struct{}]int{}
		lease := func(ch <-chan struct{}) int {
			mu.Lock()
			defer mu.Unlock()
			if l, ok := leaseOf[ch]; ok {
				leases[l].sections++
				return l
			}
			l := len(leases)
			leaseOf[ch] = l
			leases = append(leases, leaseRecord{client: i, sections: 1})
			timing := recs[i].currentLease()
			watchers.Go(func() {
				<-ch // closed at the latest by the last RUnlockCtx
				lostAt := time.Now()
				mu.Lock()
				leases[l].lostAt = lostAt
				mu.Unlock()
			})
			if timing == nil {
				unexplained = append(unexplained, fmt.Sprintf("lease %d (client %d): no acquire of the client returned it", l, i))
			} else {
				leaseTimings[l] = timing
			}
			return l
		}
		for w := range rwWriters(i) {
			running.Add(1)
			wg.Go(func() {
				defer running.Add(-1)
				rng := rand.New(rand.NewPCG(uint64(i*16+w), uint64(time.Now().UnixNano())))
				for ctx.Err() == nil {
					// Writers pause between their holds, so that readers
					// get to share leases.
					time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
					lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					var err error
					ok := true
					if rng.IntN(8) == 0 {
						ok, err = rw.TryLockCtx(lctx)
					} else {
						err = rw.LockCtx(lctx)
					}
					cancel()
					if err != nil {
						count("lock", err)
						continue
					}
					if !ok {
						tryMisses.Add(1)
						continue
					}
					h := holdRecord{client: i, token: rw.Token(), start: time.Now()}
					lost := rw.Lost()
					h.validAtStart = isOpen(lost)
					timing := recs[i].writer(h.token)
					watched := make(chan struct{})
					go func() {
						defer close(watched)
						<-lost
						h.lostAt = time.Now()
					}()
					mu.Lock()
					id := len(holds)
					holds = append(holds, holdRecord{})
					if timing == nil || !timing.explained {
						unexplained = append(unexplained, fmt.Sprintf("hold %d (client %d, token %d): no acquire reply of the client granted its token", id, i, h.token))
					}
					mu.Unlock()

					resource.write(id, h.token)
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					if stallTurn.Load()%2 == 0 && stall[i].CompareAndSwap(true, false) {
						stallTurn.Add(1)
						h.paused = true
						stalls.Add(1)
						stalled(i, func(ended func()) {
							pauseClient(links[i], chaosExpiry*3/2+time.Duration(rng.IntN(500))*time.Millisecond, ended)
						})
					}
					resource.write(id, h.token)
					h.end = time.Now()
					h.validAtEnd = isOpen(lost)
					h.unlockStart = time.Now()
					h.unlockErr = rw.UnlockCtx(context.Background())
					if timing != nil {
						h.until = timing.deadline() // every extend has ended with UnlockCtx
					}
					<-watched
					mu.Lock()
					holds[id] = h
					if h.unlockErr != nil {
						errs["unlock: "+errKind(h.unlockErr)]++
					}
					mu.Unlock()
				}
			})
		}
		for r := range rwReaders(i) {
			running.Add(1)
			wg.Go(func() {
				defer running.Add(-1)
				rng := rand.New(rand.NewPCG(uint64(i*16+8+r), uint64(time.Now().UnixNano())))
				for ctx.Err() == nil {
					time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					var err error
					ok := true
					if rng.IntN(8) == 0 {
						ok, err = rw.TryRLockCtx(lctx)
					} else {
						err = rw.RLockCtx(lctx)
					}
					cancel()
					if err != nil {
						count("rlock", err)
						continue
					}
					if !ok {
						tryMisses.Add(1)
						continue
					}
					rd := readRecord{client: i, start: time.Now()}
					ch := rw.RLost()
					rd.validAtStart = isOpen(ch)
					rd.lease = lease(ch)
					rd.first, rd.firstAt = resource.read()
					if d := rwReadFor(i, rng); d > 0 {
						time.Sleep(d)
					}
					if stallTurn.Load()%2 == 1 && stall[i].CompareAndSwap(true, false) {
						stallTurn.Add(1)
						rd.paused = true
						stalls.Add(1)
						stalled(i, func(ended func()) {
							pauseClient(links[i], chaosExpiry*3/2+time.Duration(rng.IntN(500))*time.Millisecond, ended)
						})
					}
					rd.second, rd.secondAt = resource.read()
					rd.end = time.Now()
					rd.validAtEnd = isOpen(ch)
					unlockStart := time.Now()
					err = rw.RUnlockCtx(context.Background())
					unlockEnd := time.Now()
					mu.Lock()
					reads = append(reads, rd)
					l := &leases[rd.lease]
					if unlockStart.After(l.unlockStart) {
						l.unlockStart = unlockStart
					}
					if unlockEnd.After(l.unlockEnd) {
						l.unlockEnd = unlockEnd
					}
					if err != nil {
						l.unlockErr = err
						errs["runlock: "+errKind(err)]++
					}
					mu.Unlock()
				}
			})
		}
	}

	faults, timeline, episodes := runFaults(t, s, servers, links, stall, start, duration, time.Sleep)
	stop()
	// Every call of the clients is bounded once ctx ends: a lock call at
	// once, an unlock by the node timeout (after a wait for a slot of at
	// most the expiry). A client that does not stop within rwStopBound of
	// the end (or of the end of the latest stall) is a hang: report where
	// it is.
	stopping := time.Now()
	var hung []string
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()
	for done := false; !done; {
		select {
		case <-clientsDone:
			done = true
		case <-time.After(100 * time.Millisecond):
		}
		since := time.Since(start.Add(max(stopping.Sub(start), time.Duration(stallEnd.Load()))))
		switch {
		case done || len(hung) > 0:
		case since > rwStopBound && running.Load() > inStall.Load():
			hung = append(hung, fmt.Sprintf("%d clients' goroutines still running %v after the end, %d of them in a stall; goroutines:\n\n%s",
				running.Load(), time.Since(stopping).Round(time.Millisecond), inStall.Load(), allGoroutines()))
		}
		if time.Since(stopping) > 2*time.Minute {
			t.Fatalf("%v\n\nclients still running 2 minutes after the end (%d goroutines, %d in a stall); goroutines:\n\n%s", hung, running.Load(), inStall.Load(), allGoroutines())
		}
	}
	if len(hung) > 0 {
		hung = append(hung, fmt.Sprintf("the clients took %v to stop", time.Since(stopping).Round(time.Millisecond)))
	}
	if !waitGroupWithin(&watchers, 10*time.Second) {
		t.Fatalf("RLost() of a lease still open 10s after every reader stopped")
	}
	stopped := time.Now()
	elapsed := stopping.Sub(start)
	stranded := checkStrandedRW(t, servers, rwName, stopped, trace)

	for l, timing := range leaseTimings {
		leases[l].until = timing.deadline()
		leases[l].explained = timing.explained
		leases[l].engineLost, leases[l].engineReason = timing.lost()
	}
	slack := func(from, to time.Time) time.Duration { return chaosSlack + probe.longest(from, to) }
	violations, fig := checkRWHistory(holds, reads, leases, resource.writes, resource.at, slack)
	// The readers wait whenever they do not read: twenty over the eight
	// clients, each pausing at most 2ms between its attempts, a failed or
	// missed one included. So whenever nobody reads or writes, some client
	// waits for the lock, whatever the writers' pauses between their holds.
	// The clients' stalls are faults here (see stallEpisodes).
	// A CLIENT PAUSE WRITE may leave a read lease nobody holds (a known
	// defect: see knownDefects).
	freed, freedMax := checkFreed(rwSpans(holds, reads, leases), 1, 1, knownDefects(stallEps.with(episodes), "pause-write"), start, stopping, slack)
	violations = append(violations, freed...)
	linearizable, notLinearizable := checkLinearizable("the RW lock's resource", rwOps(resource, reads))
	violations = append(violations, notLinearizable...)
	violations = append(violations, hung...)
	violations = append(violations, unexplained...)
	violations = append(violations, stranded...)
	for _, e := range slices.Sorted(maps.Keys(errs)) {
		if strings.Contains(e, "UNDOCUMENTED") {
			violations = append(violations, fmt.Sprintf("%d times %s", errs[e], e))
		}
	}
	for _, h := range holds {
		if h.token == 0 {
			violations = append(violations, fmt.Sprintf("client %d held with token 0", h.client))
		}
	}
	handedOver := 0
	for _, timing := range leaseTimings {
		handedOver += timing.handedOvers
	}
	errCount := 0
	for _, n := range errs {
		errCount += n
	}
	figures := fmt.Sprintf("%v, %d clients on %d servers, %d writers and %d readers: %d reads on %d leases (%d handed over locally), %d write holds (%d writes, %d stale rejected); overlaps %d, token regressions %d; holds lost: %d write, %d leases (%d read sections not valid at their end, %d of which saw the resource change); valid reads that saw a lost writer's write with the latest token %d; try misses %d; latest Lost() %v, RLost() %v after the deadline (longest process stall %v); stranded after the fault cleared: max %v (bound %v); linearizable (porcupine, fenced register): %v; faults %v, client stalls %d; errors %d %v; clients stopped in %v; violations %d",
		elapsed.Round(time.Second), rwClients, s.nodes, sumOver(rwWriters), sumOver(rwReaders),
		fig.reads, fig.leases, handedOver, fig.holds, fig.writes, fig.staleRejected, fig.overlaps, fig.tokenRegression,
		fig.lost, fig.leasesLost, fig.readsLost, fig.staleReads, fig.staleSeen, tryMisses.Load(),
		fig.maxLate.Round(time.Millisecond), fig.maxLeaseLate.Round(time.Millisecond), probe.longest(start, stopped).Round(time.Millisecond),
		freedMax.Round(time.Millisecond), freedBound, linearizable, faults, stalls.Load(), errCount, errs, stopped.Sub(stopping).Round(time.Millisecond), len(violations))
	redistest.Report(t, "%s", figures)
	for i, v := range violations {
		if i == 20 {
			t.Errorf("... and %d more", len(violations)-i)
			break
		}
		t.Error(v)
	}
	if len(violations) > 0 {
		logViolatedRW(t, violations, holds, reads, leases, start, timeline)
		logTraced(t, violations, holds, leases, trace, start)
	}
	if fig.holds < 10 || fig.reads < 10 {
		t.Errorf("only %d write holds and %d reads: the lock made no progress between the faults", fig.holds, fig.reads)
	}
}

// sumOver returns the sum of f over the chaos tests' clients.
func sumOver(f func(int) int) (n int) {
	for i := range rwClients {
		n += f(i)
	}
	return n
}

// rwStopBound is how long the clients of an RW chaos test may take to stop
// once told to, or once their latest stall ended: an unlock (a node
// timeout, after a wait for a slot of up to the expiry), with room.
const rwStopBound = 5 * chaosExpiry

// allGoroutines returns the stacks of every goroutine.
func allGoroutines() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitGroupWithin waits for wg up to d, and reports whether it is done.
func waitGroupWithin(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// checkStrandedRW looks at the keys of NetRWMutex name on every server,
// every client having stopped (at stopped) and every fault over. Within
// strandedGrace, the writer key must be gone and no read lease may be
// live: as for a NetMutex (checkStranded), a release that a fault kept back
// is delivered by the reaper. Within three expiries more (a waiter keeps its
// place that long after its last attempt, the queues and the leases set
// keep TTLs that long), every key must be gone. It returns a violation for
// each key on each server that outlives its bound.
func checkStrandedRW(t *testing.T, servers []*redistest.Server, name string, stopped time.Time, trace *evalTrace) (violations []string) {
	t.Helper()
	w := lockKey(name) + ":rw"
	leases := w + ":leases"
	for k, s := range servers {
		// held reports what still keeps a writer or reader out at once.
		held := func() (what, nonce string, err error) {
			pttl, err := s.Do("PTTL", w)
			if err != nil {
				return "", "", err
			}
			if pttl != "-2" {
				value, _ := s.Do("GET", w)
				nonce, _, _ = strings.Cut(value, ".")
				return fmt.Sprintf("writer key holding %q with %sms of TTL left", value, pttl), nonce, nil
			}
			now, err := s.Do("TIME")
			if err != nil {
				return "", "", err
			}
			f := strings.Fields(now)
			sec, _ := strconv.ParseInt(f[0], 10, 64)
			us, _ := strconv.ParseInt(f[1], 10, 64)
			live, err := s.Do("ZRANGEBYSCORE", leases, "("+strconv.FormatInt(sec*1000+us/1000, 10), "+inf", "WITHSCORES")
			if err != nil || live == "" {
				return "", "", err
			}
			return "live read leases " + strings.ReplaceAll(live, "\n", " "), "", nil
		}
		for {
			what, nonce, err := held()
			if err != nil {
				violations = append(violations, fmt.Sprintf("server %d, every client stopped: %v", k, err))
				break
			}
			if what == "" {
				break
			}
			grace := strandedGrace
			if nonce != "" && trace != nil && trace.leftInFault(nonce, "rw_leave") {
				// A grant to a waiter that gave up while a fault cut its
				// process off, so that its leave failed: its place stayed
				// queued, and its pub/sub connection, held open by the
				// fault, still counted as listening when a release
				// granted it the writer key. Nobody takes such a grant up
				// (the process, if it hears of it, gives it back: see
				// NetMutex.orphan), and it expires with the key, within an
				// expiry of the release that made it (the clients' last,
				// or a reaper's within strandedGrace).
				grace = chaosExpiry + strandedGrace
			}
			if since := time.Since(stopped); since >= grace {
				v := fmt.Sprintf("server %d: %s, %v after every client stopped: stranded", k, what, since.Round(time.Millisecond))
				if nonce != "" && trace != nil {
					// The calls that named it, by time since the test
					// began; every client stopped at stopped.
					v += fmt.Sprintf("; the calls that named %s, timed from when every client stopped:\n%s", nonce, trace.about(nonce, stopped))
				}
				violations = append(violations, v)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	bound := 3*chaosExpiry + strandedGrace // a place lasts three expiries (netlock.NewRW)
	for k, s := range servers {
		for _, key := range []string{w, w + ":writers", w + ":readers", leases} {
			for {
				n, err := s.Do("EXISTS", key)
				if err != nil {
					violations = append(violations, fmt.Sprintf("server %d, every client stopped: %v", k, err))
					break
				}
				if n == "0" {
					break
				}
				if since := time.Since(stopped); since >= bound {
					content, _ := s.Do("ZRANGE", key, "0", "-1", "WITHSCORES")
					pttl, _ := s.Do("PTTL", key)
					violations = append(violations, fmt.Sprintf("server %d: %s still there %v after every client stopped (TTL %sms): %q", k, key, since.Round(time.Millisecond), pttl, content))
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return violations
}

// logViolatedRW logs, for the write holds and read sections that
// violations name, what the client saw (times from the start of the run),
// and the faults.
func logViolatedRW(t *testing.T, violations []string, holds []holdRecord, reads []readRecord, leases []leaseRecord, start time.Time, timeline []string) {
	t.Helper()
	at := func(tm time.Time) string {
		if tm.IsZero() {
			return "-"
		}
		return tm.Sub(start).Round(time.Microsecond).String()
	}
	paths := make([]holdPath, len(holds))
	logViolated(t, violations, holds, paths, start, nil)
	seen := map[string]bool{}
	for _, v := range violations {
		for _, sub := range readRef.FindAllStringSubmatch(v, -1) {
			i, err := strconv.Atoi(sub[1])
			if err != nil || i >= len(reads) || seen["r"+sub[1]] {
				continue
			}
			seen["r"+sub[1]] = true
			r := &reads[i]
			t.Logf("read %d: client %d (%s), lease %d: start %s (valid %v), end %s (valid %v), writes seen %d at %s, %d at %s, paused %v",
				i, r.client, chaosClient(t, r.client), r.lease, at(r.start), r.validAtStart, at(r.end), r.validAtEnd,
				r.first, at(r.firstAt), r.second, at(r.secondAt), r.paused)
		}
		for _, sub := range leaseRef.FindAllStringSubmatch(v, -1) {
			i, err := strconv.Atoi(sub[1])
			if err != nil || i >= len(leases) || seen["l"+sub[1]] {
				continue
			}
			seen["l"+sub[1]] = true
			l := &leases[i]
			t.Logf("lease %d: client %d (%s), %d sections: until %s, RLost() %s, last RUnlock from %s to %s: %v; the Observer's Lost: %s %q",
				i, l.client, chaosClient(t, l.client), l.sections, at(l.until), at(l.lostAt), at(l.unlockStart), at(l.unlockEnd), l.unlockErr, at(l.engineLost), l.engineReason)
		}
	}
	for _, f := range timeline {
		t.Logf("fault %s", f)
	}
}

// logTraced logs, for each write hold and lease a violation names, its
// client's script calls from an expiry before its deadline to its (last)
// unlock.
func logTraced(t *testing.T, violations []string, holds []holdRecord, leases []leaseRecord, trace *evalTrace, start time.Time) {
	t.Helper()
	for _, v := range violations {
		for _, sub := range holdRef.FindAllStringSubmatch(v, -1) {
			i, err := strconv.Atoi(sub[1])
			if err != nil || i >= len(holds) {
				continue
			}
			h := &holds[i]
			to := h.until
			if h.unlockStart.After(to) {
				to = h.unlockStart
			}
			to = to.Add(100 * time.Millisecond)
			t.Logf("hold %d: client %d's script calls:\n%s", i, h.client, trace.window(h.client, h.until.Add(-chaosExpiry-200*time.Millisecond), to, start))
		}
		for _, sub := range leaseRef.FindAllStringSubmatch(v, -1) {
			i, err := strconv.Atoi(sub[1])
			if err != nil || i >= len(leases) {
				continue
			}
			l := &leases[i]
			to := l.unlockEnd
			if to.IsZero() {
				to = l.until
			}
			t.Logf("lease %d: client %d's script calls:\n%s", i, l.client, trace.window(l.client, l.until.Add(-chaosExpiry-200*time.Millisecond), to, start))
		}
	}
}

var (
	readRef  = regexp.MustCompile(`read (\d+)`)
	leaseRef = regexp.MustCompile(`lease (\d+)`)
)
