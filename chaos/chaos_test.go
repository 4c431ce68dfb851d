package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
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

// soakEnv sets how long each chaos test runs, as a Go duration ("10m");
// without it, chaosCI.
const soakEnv = "NETLOCK_SOAK"

// seedEnv sets the seed of runFaults' faults, as logged by an earlier run
// ("faults from seed N"): the same faults come in the same order, on the
// same servers and clients, with the same holds and quiet times. Without
// it, the seed is the time.
const seedEnv = "NETLOCK_CHAOS_SEED"

const (
	chaosCI      = 20 * time.Second
	chaosNodes   = 5
	chaosClients = 8
	chaosExpiry  = time.Second
	// chaosDrift is the clients' drift factor: a tenth of the expiry. On
	// this machine, under the race detector, a goroutine may be scheduled
	// tens of milliseconds late, and the drift allowance is the margin
	// between a hold's local deadline and its keys' expiry.
	chaosDrift = 0.1
	// chaosSlack is how late after a hold's local deadline Lost() may be seen
	// closed: two goroutines (the watchdog, the test's watcher) must be
	// scheduled on a loaded machine, under the race detector. The longest
	// stall of the whole process that stallProbe saw meanwhile is added.
	chaosSlack = 100 * time.Millisecond
	// chaosQuiet is the least quiet time between two faults on a single
	// server, which every fault stops: long enough for the clients to
	// reconnect after a restart and to pass the lock round many times.
	chaosQuiet = time.Second
	// strandedGrace is how long after every client stopped a lock key may
	// still be on a server, all faults over: a release that a fault kept
	// back is delivered by its reaper, whose passes are at most 250ms apart
	// (netlock's reapMaxPause), each bounded by the node timeout.
	strandedGrace = 750 * time.Millisecond
)

// faultSeed returns the seed of a chaos test's faults: $NETLOCK_CHAOS_SEED,
// or the time.
func faultSeed(t *testing.T) uint64 {
	t.Helper()
	v := os.Getenv(seedEnv)
	if v == "" {
		return uint64(time.Now().UnixNano())
	}
	seed, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want a seed as a run logged it (faults from seed N)", seedEnv, v)
	}
	return seed
}

// chaosDuration returns how long a chaos test runs.
func chaosDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv(soakEnv)
	if v == "" {
		return chaosCI
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 10m", soakEnv, v)
	}
	return d
}

// A chaosSetup is what differs between the chaos tests.
type chaosSetup struct {
	nodes int // redis-servers, each its own Backend
	// cluster: the servers are the masters of one Redis Cluster, one
	// Backend (a cluster client) for them all.
	cluster bool
	// victims picks the servers the next fault hits.
	victims func(rng *rand.Rand) []int
	// quiet picks how long it stays quiet after a fault.
	quiet func(rng *rand.Rand) time.Duration
}

// TestChaos runs eight clients, each with its own connections (by default
// three redigo, three rueidis, two go-redis: see chaosClient), against one
// quorum lock on five real redis-servers (AOF, fsync always, so fence
// counters survive a crash), each client reaching each server through a
// toxiproxy of its own. While they lock, write to a fenced resource and
// unlock, faults hit a random minority of the servers (one or two), one
// kind at a time in shuffled rounds:
//
//   - pause: SIGSTOP, then SIGCONT after up to 1.5 expiries;
//   - kill: SIGKILL, and a restart (from the AOF) only after the expiry;
//   - latency: toxiproxy latency of 20-300ms with jitter, beyond the node
//     timeout (100ms) at times, on the links of some or all clients;
//   - blackhole: the links of some or all clients drop everything, and are
//     cut (connections closed) when it ends;
//   - reset: the links of some or all clients are reset at their next data;
//   - Redis's refusals (refusalKinds): a demotion and promotion
//     (READONLY), a slow load after a restart (LOADING), a failed save
//     (MISCONF), maxmemory below use (OOM), a long script (BUSY), CLIENT
//     PAUSE WRITE, SCRIPT FLUSH, CLIENT KILL of the clients' connections,
//     and the user's channel rights taken away and given back (NOPERM);
//
// and now and then a client stalls inside its critical section for longer
// than the expiry with its network frozen (a process pause, as in a GC
// pause): its hold is lost meanwhile, and it writes with its old token when
// it wakes.
//
// The history (client, token, start, end, Lost, and the hold's local
// deadline as a recorder computes it from the client's calls) is checked by
// checkHistory: no overlap between holds never reported lost, tokens
// strictly increasing, every stale write rejected, every loss signalled by
// Lost() in time. Errors must be the documented sentinels (or a
// refusal of the user's rights, NOPERM), and no release may grant the
// lock (a quorum's waiters are only told to attempt). Once a fault has
// cleared, the lock may not stay free while clients wait for it
// (checkFreed: a key left that nobody holds, waiters not told); the
// resource's history must be linearizable as a fenced register
// (checkLinearizable, by porcupine). Once the clients stop, no lock key
// may stay on a server (checkStranded), and once they are closed, no
// goroutine of netlock may run. The figures are logged and reported.
//
// It runs chaosCI by default; NETLOCK_SOAK=10m runs it for ten minutes (add
// -timeout 30m). NETLOCK_CHAOS_SEED=N runs the faults of the run that
// logged "faults from seed N" again.
func TestChaos(t *testing.T) {
	runChaos(t, chaosSetup{
		nodes:   chaosNodes,
		victims: func(rng *rand.Rand) []int { return rng.Perm(chaosNodes)[:1+rng.IntN(2)] },
		quiet:   func(rng *rand.Rand) time.Duration { return time.Duration(rng.IntN(300)) * time.Millisecond },
	})
}

// TestChaosSingle is TestChaos on a plain lock, one redis-server (AOF, fsync
// always, so that a killed server restarts with its keys and its fence
// counter), where a release grants the lock to the next live waiter in its
// own script and tells it by message (see lua/handon.lua): the grant path,
// under the same faults. A minority of one server is none, so every fault
// hits the server, each kind in turn in shuffled rounds, and stops the lock
// altogether while it lasts; between two faults it stays quiet for
// chaosQuiet to twice that, time for the lock to pass many times.
//
// The history is checked as TestChaos's, and it counts the holds that came
// by a release's message (no acquire round trip): there must be some.
// Nothing in the check changes for one server. A killed server restarts
// with its keys, but its AOF holds their expiries as absolute times (PXAT,
// PEXPIREAT) and the restart comes after the expiry, when every hold on
// them has lapsed by its local clock; with fsync always, a grant and its
// token are on disk before the server sends the message or the reply. A
// paused server's clock runs on: keys whose TTL ran out meanwhile expire as
// it resumes, after the local deadlines of the holds on them, which count
// from before the TTL was set (for a grant, from the start of the waiter's
// first round that joined the queue, before the release ran).
//
// It runs chaosCI by default, or for NETLOCK_SOAK.
func TestChaosSingle(t *testing.T) {
	runChaos(t, chaosSetup{
		nodes:   1,
		victims: func(*rand.Rand) []int { return []int{0} },
		quiet:   func(rng *rand.Rand) time.Duration { return chaosQuiet + time.Duration(rng.Int64N(int64(chaosQuiet))) },
	})
}

// runChaos runs a chaos test as TestChaos describes it, with s's servers,
// victims and quiet times.
func runChaos(t *testing.T, s chaosSetup) {
	duration := chaosDuration(t)
	// Registered first, so it runs last: after the clients are closed and
	// the servers and proxies stopped.
	t.Cleanup(func() { waitNetlockDone(t, 5*time.Second) })
	servers := startServers(t, s.nodes, serverArgs...)
	x := toxi.New(t)
	links := make([][]*toxi.Proxy, chaosClients) // [client][node]
	for i := range links {
		for _, srv := range servers {
			links[i] = append(links[i], x.Proxy(srv.Addr()))
		}
	}
	recs := make([]*recorder, chaosClients)
	ms := make([]*netlock.NetMutex, chaosClients)
	for i := range ms {
		recs[i] = newRecorder(s.nodes, chaosExpiry, chaosDrift)
		backends := make([]netlock.Backend, s.nodes)
		for k := range servers {
			backends[k] = recs[i].wrap(newBackend(t, chaosClient(t, i), links[i][k].Addr()))
		}
		m, err := netlock.New("chaos", backends, netlock.WithExpiry(chaosExpiry), netlock.WithNodeTimeout(100*time.Millisecond),
			netlock.WithDriftFactor(chaosDrift), netlock.WithRetryDelay(time.Millisecond, 20*time.Millisecond),
			netlock.WithObserver(recs[i].observer()),
			// Losses and undelivered releases are this test's daily
			// bread: it counts them, and they would drown its output.
			netlock.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		ms[i] = m
	}

	var (
		resource    fencedResource
		mu          sync.Mutex // guards holds, paths, errs and unexplained
		holds       []holdRecord
		paths       []holdPath // how each hold came
		errs        = map[string]int{}
		unexplained []string // holds that no call of their client explains
		stalls      atomic.Int64
		messages    atomic.Int64 // holds that came by a release's message
	)
	stall := make([]atomic.Bool, chaosClients) // set by the fault loop, taken by the client
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var probe stallProbe
	wg.Go(func() { probe.run(ctx) })
	for i, m := range ms {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err := m.LockCtx(lctx)
				cancel()
				if err != nil {
					mu.Lock()
					errs["lock: "+errKind(err)]++
					mu.Unlock()
					continue
				}
				h := holdRecord{client: i, token: m.Token(), start: time.Now()}
				lost := m.Lost()
				h.validAtStart = isOpen(lost)
				path, explained := recs[i].acquired(h.token)
				if path == byMessage {
					messages.Add(1)
				}
				watched := make(chan struct{})
				go func() {
					defer close(watched)
					<-lost // closed at the latest by UnlockCtx
					h.lostAt = time.Now()
				}()
				mu.Lock()
				id := len(holds)
				holds = append(holds, holdRecord{}) // filled in below
				paths = append(paths, path)
				if !explained {
					unexplained = append(unexplained, fmt.Sprintf("hold %d (client %d, token %d): no acquire reply of the client granted its token, and no join explains a grant", id, i, h.token))
				}
				mu.Unlock()

				resource.read(id)
				resource.write(id, h.token)
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				if stall[i].CompareAndSwap(true, false) {
					h.paused = true
					stalls.Add(1)
					pauseClient(links[i], chaosExpiry*3/2+time.Duration(rng.IntN(500))*time.Millisecond, nil)
				}
				resource.write(id, h.token)
				h.end = time.Now()
				h.validAtEnd = isOpen(lost)
				h.unlockStart = time.Now()
				h.unlockErr = m.UnlockCtx(context.Background())
				// Every extend of the hold has ended with UnlockCtx.
				h.until = recs[i].until(h.token)
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

	// Faults, from the test goroutine as redistest requires.
	var quietMessages []int64 // holds by message in each quiet time
	start := time.Now()
	faults, timeline, episodes := runFaults(t, s, servers, links, stall, start, duration, func(d time.Duration) {
		before := messages.Load()
		time.Sleep(d)
		quietMessages = append(quietMessages, messages.Load()-before)
	})
	stopping := time.Now()
	stop()
	wg.Wait()
	elapsed := time.Since(start)
	stranded := checkStranded(t, servers, lockKey("chaos"))

	slack := func(from, to time.Time) time.Duration { return chaosSlack + probe.longest(from, to) }
	violations, fig := checkHistory(holds, resource.writes, slack)
	freed, freedMax := checkFreed(holdSpans(holds), 1, 1, episodes, start, stopping, slack)
	violations = append(violations, freed...)
	checking := time.Now()
	linearizable, notLinearizable := checkLinearizable("the lock's resource", resource.ops)
	violations = append(violations, notLinearizable...)
	linearizeTook := time.Since(checking)
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
	var granted, skipped int
	refusals := map[string]int{}
	for _, r := range recs {
		g, s := r.figures(refusals)
		granted += g
		skipped += s
	}
	if s.nodes > 1 && granted > 0 {
		violations = append(violations, fmt.Sprintf("releases granted the lock %d times over a quorum", granted))
	}
	mix := map[string]int{}
	for i := range chaosClients {
		mix[chaosClient(t, i)]++
	}
	figures := fmt.Sprintf("%v, %d clients %v on %d servers: %d acquisitions, %d lost, %d stale writes rejected, latest Lost() %v after until (longest process stall %v); stranded after the fault cleared: max %v (bound %v); linearizable (porcupine, fenced register): %v, %d calls checked in %v; faults (servers hit, by kind) %v, client stalls %d; refusals the scripts met, by code %v; errors %v; violations %d",
		elapsed.Round(time.Second), chaosClients, mix, s.nodes, fig.holds, fig.lost, fig.staleRejected, fig.maxLate.Round(time.Millisecond), probe.longest(start, time.Now()).Round(time.Millisecond),
		freedMax.Round(time.Millisecond), freedBound, linearizable, len(resource.ops), linearizeTook.Round(time.Millisecond), faults, stalls.Load(), refusals, errs, len(violations))
	if s.nodes == 1 {
		slices.Sort(quietMessages)
		adopted := 0
		for _, p := range paths {
			if p == byAdoption {
				adopted++
			}
		}
		figures += fmt.Sprintf("; by grant: %d holds by message (no round trip), %d adopted by a round, of %d grants that replies told of; %d queued waiters nobody listened for skipped; holds by message in a quiet time: fewest %d, median %d",
			messages.Load(), adopted, granted, skipped, quietMessages[0], quietMessages[len(quietMessages)/2])
	}
	redistest.Report(t, "%s", figures)
	for i, h := range holds {
		if late := h.lostAt.Sub(h.until); h.signalled() && late > chaosSlack/2 {
			t.Logf("hold %d: client %d (%s), paused %v: held %v, Lost() %v after until, process stalled %v meanwhile, unlock %v",
				i, h.client, chaosClient(t, h.client), h.paused, h.end.Sub(h.start), late,
				probe.longest(h.until, h.lostAt), h.unlockErr)
		}
	}
	for i, v := range violations {
		if i == 20 {
			t.Errorf("... and %d more", len(violations)-i)
			break
		}
		t.Error(v)
	}
	if len(violations) > 0 {
		logViolated(t, violations, holds, paths, start, timeline)
	}
	if fig.holds < 10 {
		t.Errorf("only %d acquisitions: the lock made no progress between the faults", fig.holds)
	}
	if s.nodes == 1 && messages.Load() == 0 {
		t.Errorf("no acquisition came by a release's message: the grant path was not exercised")
	}
}

// runFaults injects faults as TestChaos describes them, from the calling
// (test) goroutine as redistest requires, until duration has passed since
// start: each episode hits s.victims of servers, one kind of faultKinds at
// a time in shuffled rounds, on the links of a random set of clients for
// the network faults (links is [client][node]); every fourth episode sets
// the stall flag of a random client, for it to take in its next critical
// section. After each episode it calls quiet with the quiet time s.quiet
// picked, which must sleep that long. Its random choices come from
// faultSeed. It returns the servers hit by kind, the episodes, and their
// timeline as text, for a report of violations.
func runFaults(t *testing.T, s chaosSetup, servers []*redistest.Server, links [][]*toxi.Proxy, stall []atomic.Bool, start time.Time, duration time.Duration, quiet func(time.Duration)) (faults map[string]int, timeline []string, episodes []episode) {
	t.Helper()
	seed := faultSeed(t)
	t.Logf("faults from seed %d (%s=%d replays them)", seed, seedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 5))
	faults = map[string]int{}
	refusals := map[string]map[string]int{} // by kind of fault: the refusals its victims answered, by code, and what refuse reported
	clients := len(links)
	kinds := faultKinds(t, s)
	addFillers(t, s, servers)
	for n := 0; time.Since(start) < duration; n++ {
		if n%len(kinds) == 0 {
			rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		}
		kind := kinds[n%len(kinds)]
		victims := s.victims(rng)
		hit := rng.Perm(clients)[:1+rng.IntN(clients)] // the clients whose links a network fault hits
		hold := time.Duration(50+rng.IntN(1500)) * time.Millisecond
		// A killed server restarts only after the expiry, as Redlock's
		// delayed restart: by then every hold on it has lapsed, and a
		// release it refused meanwhile (a connection refused, which the
		// reaper does not send again) has nothing left to delete.
		wait := chaosExpiry + time.Duration(rng.IntN(500))*time.Millisecond
		faults[kind] += len(victims)
		before := errorStats(servers, victims)
		var did map[string]int
		from := time.Now()
		switch kind {
		case "pause":
			for _, v := range victims {
				servers[v].Pause()
			}
			time.Sleep(hold)
			for _, v := range victims {
				servers[v].Resume()
			}
		case "kill":
			for _, v := range victims {
				servers[v].Kill()
			}
			time.Sleep(wait)
			for _, v := range victims {
				servers[v].Restart()
			}
		case "latency", "blackhole", "reset":
			var toxic toxi.Toxic
			switch kind {
			case "latency":
				toxic = toxi.Latency("upstream", 20+rng.IntN(280), rng.IntN(50))
			case "blackhole":
				toxic = toxi.Blackhole("upstream")
			case "reset":
				toxic = toxi.ResetPeer("upstream", rng.IntN(20))
			}
			for _, c := range hit {
				for _, v := range victims {
					if err := links[c][v].Add(kind, toxic); err != nil {
						t.Fatal(err)
					}
				}
			}
			time.Sleep(hold)
			for _, c := range hit {
				for _, v := range victims {
					if kind == "blackhole" {
						if err := links[c][v].Cut(kind); err != nil {
							t.Fatal(err)
						}
					} else {
						links[c][v].Remove(kind)
					}
				}
			}
		default:
			hitServers := make([]*redistest.Server, len(victims))
			for k, v := range victims {
				hitServers[k] = servers[v]
			}
			did = refuse(t, kind, hitServers, hold, wait)
		}
		e := episode{kind: kind, from: from, cleared: time.Now()}
		e.settled = e.cleared
		episodes = append(episodes, e)
		answered := answeredSince(before, errorStats(servers, victims))
		maps.Copy(answered, did)
		if refusals[kind] == nil {
			refusals[kind] = map[string]int{}
		}
		for code, n := range answered {
			refusals[kind][code] += n
		}
		if kind == "latency" || kind == "blackhole" || kind == "reset" {
			timeline = append(timeline, fmt.Sprintf("%v-%v %s: servers %v, clients %v", from.Sub(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond), kind, victims, hit))
		} else {
			timeline = append(timeline, fmt.Sprintf("%v-%v %s: servers %v, answering %v", from.Sub(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond), kind, victims, answered))
		}
		if n%4 == 3 {
			c := rng.IntN(clients)
			stall[c].Store(true)
			timeline = append(timeline, fmt.Sprintf("%v client %d to stall", time.Since(start).Round(time.Millisecond), c))
		}
		quiet(s.quiet(rng))
	}
	t.Logf("refusals the servers hit answered, by fault: %v", refusals)
	return faults, timeline, episodes
}

// An episode is one fault of runFaults: from when it began to when it
// cleared (every victim takes every call again).
type episode struct {
	kind          string
	from, cleared time.Time
	// settled is when what the fault left may have lasted until: when it
	// cleared, or later for a known defect (see knownDefects).
	settled time.Time
}

// checkStranded looks at the lock key on every server, every client
// stopped and every fault over, and returns a violation for each server on
// which it outlives strandedGrace with TTL left: a key that nobody holds
// and no release will delete, stranded until it expires. A key with less
// TTL left than the grace cannot be told from one a release is about to
// delete, and is let go. Of a Redis Cluster's masters, only the one that
// serves the key's slot is looked at (the others answer MOVED).
func checkStranded(t *testing.T, servers []*redistest.Server, key string) (violations []string) {
	t.Helper()
	began, stopped := time.Now(), time.Now()
	for k, s := range servers {
		for {
			since := time.Since(stopped)
			pttl, err := s.Do("PTTL", key)
			if err != nil && strings.HasPrefix(err.Error(), "MOVED ") {
				break // a Cluster node that does not serve key's slot
			}
			if err != nil && recovering(err) && time.Since(began) < recoverBound {
				// A Cluster whose master the last fault restarted is down
				// until its nodes agree again, and the releases the reapers
				// hold back wait for it: the grace starts when it answers.
				time.Sleep(50 * time.Millisecond)
				stopped = time.Now()
				continue
			}
			if err != nil {
				violations = append(violations, fmt.Sprintf("PTTL of the lock key on server %d, every client stopped: %v", k, err))
				break
			}
			left, _ := strconv.Atoi(pttl)
			if left == -2 { // gone
				break
			}
			if since >= strandedGrace {
				value, _ := s.Do("GET", key)
				violations = append(violations, fmt.Sprintf("lock key on server %d still there %v after every client stopped, holding %q with %dms of TTL left: stranded", k, since.Round(time.Millisecond), value, left))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return violations
}

// recoverBound bounds how long checkStranded waits for a server that is
// still recovering from the last fault (a Cluster not yet agreed again, a
// restarted server loading its AOF).
const recoverBound = 30 * time.Second

// recovering reports whether err is a server's answer while it recovers from
// a fault, which a later call outgrows.
func recovering(err error) bool {
	for _, p := range []string{"CLUSTERDOWN ", "LOADING ", "TRYAGAIN "} {
		if strings.HasPrefix(err.Error(), p) {
			return true
		}
	}
	return false
}

// logViolated logs, for the holds that violations name, what the client
// saw (times from the start of the run), and the faults.
func logViolated(t *testing.T, violations []string, holds []holdRecord, paths []holdPath, start time.Time, timeline []string) {
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
			t.Logf("hold %d: client %d (%s), token %d, by %v: start %s (valid %v), end %s (valid %v), until %s, Lost() %s, unlock %s: %v, paused %v",
				i, h.client, chaosClient(t, h.client), h.token, paths[i], at(h.start), h.validAtStart,
				at(h.end), h.validAtEnd, at(h.until), at(h.lostAt), at(h.unlockStart), h.unlockErr, h.paused)
		}
	}
	for _, f := range timeline {
		t.Logf("fault %s", f)
	}
}

var holdRef = regexp.MustCompile(`hold (\d+)`)

// stallProbe measures how long the test process goes without being
// scheduled: it sleeps 2ms at a time and records every sleep that took much
// longer.
type stallProbe struct {
	mu     sync.Mutex
	stalls []stall
}

type stall struct{ from, to time.Time }

func (p *stallProbe) run(ctx context.Context) {
	const nap = 2 * time.Millisecond
	for ctx.Err() == nil {
		from := time.Now()
		time.Sleep(nap)
		if to := time.Now(); to.Sub(from) > nap+5*time.Millisecond {
			p.mu.Lock()
			p.stalls = append(p.stalls, stall{from, to})
			p.mu.Unlock()
		}
	}
}

// longest returns the longest stall that overlaps [from, to].
func (p *stallProbe) longest(from, to time.Time) (d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.stalls {
		if s.from.Before(to) && s.to.After(from) {
			d = max(d, s.to.Sub(s.from))
		}
	}
	return d
}

// pauseClient simulates a process pause of d (a stop-the-world GC, a
// suspended VM) for the client whose links these are: nothing it sends is
// delivered, so its watchdog cannot extend and its hold lapses, while the
// calling goroutine, inside the critical section, sleeps. What was held
// back is delivered when the pause ends, late. ended, if not nil, is
// called once every link delivers again.
func pauseClient(links []*toxi.Proxy, d time.Duration, ended func()) {
	for _, p := range links {
		p.Stall()
	}
	time.Sleep(d)
	for _, p := range links {
		p.Resume()
	}
	if ended != nil {
		ended()
	}
}

// waitNetlockDone waits until no goroutine runs code of package netlock,
// failing the test if one still does after d: once their clients are
// closed and their servers stopped, every reaper ends at its next pass
// (every call then fails for good) and every hub's reader with its
// connection. It reads the goroutines' stacks, as goleak does, so that it
// needs nothing of the library's internals.
func waitNetlockDone(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := netlockGoroutines()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d goroutines of package netlock still run %v after the clients were closed:\n\n%s", len(left), d, strings.Join(left, "\n\n"))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// netlockGoroutines returns the stacks of the goroutines that have a frame
// of package netlock (not of the packages under it, such as this one).
func netlockGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, line := range strings.Split(g, "\n") {
			if strings.HasPrefix(line, "github.com/netlock-go/netlock.") {
				found = append(found, g)
				break
			}
		}
	}
	return found
}
