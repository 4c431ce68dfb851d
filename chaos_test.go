package netlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// soakEnv sets how long each chaos test runs, as a Go duration ("10m");
// without it, chaosCI.
const soakEnv = "NETLOCK_SOAK"

const (
	chaosCI      = 20 * time.Second
	chaosNodes   = 5
	chaosClients = 8
	chaosExpiry  = time.Second
	// chaosSlack is how late after a hold's local deadline Lost() may be seen
	// closed: two goroutines (the watchdog, the test's watcher) must be
	// scheduled on a loaded machine, under the race detector. The longest
	// stall of the whole process that stallProbe saw meanwhile is added.
	chaosSlack = 100 * time.Millisecond
	// chaosQuiet is the least quiet time between two faults on a single
	// server, which every fault stops: long enough for the clients to
	// reconnect after a restart and to pass the lock round many times.
	chaosQuiet = time.Second
)

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
	// victims picks the servers the next fault hits.
	victims func(rng *rand.Rand) []int
	// quiet picks how long it stays quiet after a fault.
	quiet func(rng *rand.Rand) time.Duration
}

// TestChaos runs eight clients, each with its own connections (four redigo,
// four rueidis), against one quorum lock on five real redis-servers (AOF,
// fsync always, so fence counters survive a crash), each client reaching
// each server through a toxiproxy of its own. While they lock, write to a
// fenced resource and unlock, faults hit a random minority of the servers
// (one or two), one kind at a time in shuffled rounds:
//
//   - pause: SIGSTOP, then SIGCONT after up to 1.5 expiries;
//   - kill: SIGKILL, and a restart (from the AOF) only after the expiry;
//   - latency: toxiproxy latency of 20-300ms with jitter, beyond the node
//     timeout (100ms) at times, on the links of some or all clients;
//   - blackhole: the links of some or all clients drop everything, and are
//     cut (connections closed) when it ends;
//   - reset: the links of some or all clients are reset at their next data;
//
// and now and then a client stalls inside its critical section for longer
// than the expiry with its network frozen (a process pause, as in a GC
// pause): its hold is lost meanwhile, and it writes with its old token when
// it wakes.
//
// The history (client, token, start, end, Lost) is checked by checkHistory:
// no overlap between holds never reported lost, tokens strictly increasing,
// every stale write rejected, every loss signalled by Lost() in time. Errors
// must be the documented sentinels, and no release may grant the lock (a
// quorum's waiters are only told to attempt). The figures are logged and
// reported.
//
// It runs chaosCI by default; NETLOCK_SOAK=10m runs it for ten minutes (add
// -timeout 30m).
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
// last round that found the lock held, before the release ran).
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
	servers := startServers(t, s.nodes, "--appendonly", "yes", "--appendfsync", "always")
	x := redistest.NewToxiproxy(t)
	links := make([][]*redistest.ToxiProxy, chaosClients) // [client][node]
	spies := make([][]*spyBackend, chaosClients)          // [client][node]
	ms := make([]*NetMutex, chaosClients)
	// Registered before the clients, so it runs after they are closed.
	t.Cleanup(func() { waitReapersDone(t, ms) })
	for i := range ms {
		client := []string{"redigo", "rueidis"}[i%2]
		backends := make([]Backend, s.nodes)
		for k, srv := range servers {
			p := x.Proxy(srv.Addr())
			links[i] = append(links[i], p)
			spies[i] = append(spies[i], &spyBackend{Backend: newBackend(t, client, p.Addr())})
			backends[k] = spies[i][k]
		}
		m, err := New("chaos", backends, WithExpiry(chaosExpiry), WithNodeTimeout(100*time.Millisecond),
			// A tenth of the expiry: on this machine, under the race
			// detector, a goroutine may be scheduled tens of milliseconds
			// late, and the drift allowance is the margin between a
			// hold's local deadline and its keys' expiry.
			WithDriftFactor(0.1), WithRetryDelay(time.Millisecond, 20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if m.grants != (s.nodes == 1) {
			t.Fatalf("client %d (%s) on %d servers: grants %v, want %v", i, client, s.nodes, m.grants, s.nodes == 1)
		}
		ms[i] = m
	}

	var (
		resource fencedResource
		mu       sync.Mutex // guards holds, paths and errs
		holds    []holdRecord
		paths    []holdPath // how each hold came
		errs     = map[string]int{}
		stalls   atomic.Int64
		messages atomic.Int64 // holds that came by a release's message
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
				path := byRound // over a quorum, releases grant nothing
				if s.nodes == 1 {
					path = spies[i][0].path(h.token)
				}
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
				mu.Unlock()

				resource.write(id, h.token)
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				if stall[i].CompareAndSwap(true, false) {
					h.paused = true
					stalls.Add(1)
					pauseClient(t, links[i], chaosExpiry*3/2+time.Duration(rng.IntN(500))*time.Millisecond)
				}
				resource.write(id, h.token)
				h.end = time.Now()
				h.validAtEnd = isOpen(lost)
				h.until = holdUntil(m)
				h.unlockStart = time.Now()
				h.unlockErr = m.UnlockCtx(context.Background())
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
	seed := uint64(time.Now().UnixNano())
	t.Logf("faults from seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 5))
	faults := map[string]int{}
	var timeline []string     // the faults, for a report of violations
	var quietMessages []int64 // holds by message in each quiet time
	kinds := []string{"pause", "kill", "latency", "blackhole", "reset"}
	start := time.Now()
	for episode := 0; time.Since(start) < duration; episode++ {
		if episode%len(kinds) == 0 {
			rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		}
		kind := kinds[episode%len(kinds)]
		victims := s.victims(rng)
		clients := rng.Perm(chaosClients)[:1+rng.IntN(chaosClients)]
		hold := time.Duration(50+rng.IntN(1500)) * time.Millisecond
		faults[kind] += len(victims)
		from := time.Since(start)
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
			time.Sleep(chaosExpiry + time.Duration(rng.IntN(500))*time.Millisecond)
			for _, v := range victims {
				servers[v].Restart()
			}
		case "latency", "blackhole", "reset":
			var toxic redistest.Toxic
			switch kind {
			case "latency":
				toxic = redistest.Latency("upstream", 20+rng.IntN(280), rng.IntN(50))
			case "blackhole":
				toxic = redistest.Blackhole("upstream")
			case "reset":
				toxic = redistest.ResetPeer("upstream", rng.IntN(20))
			}
			for _, c := range clients {
				for _, v := range victims {
					if err := links[c][v].Add(kind, toxic); err != nil {
						t.Fatal(err)
					}
				}
			}
			time.Sleep(hold)
			for _, c := range clients {
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
		}
		if kind == "latency" || kind == "blackhole" || kind == "reset" {
			timeline = append(timeline, fmt.Sprintf("%v-%v %s: servers %v, clients %v", from.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), kind, victims, clients))
		} else {
			timeline = append(timeline, fmt.Sprintf("%v-%v %s: servers %v", from.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), kind, victims))
		}
		if episode%4 == 3 {
			c := rng.IntN(chaosClients)
			stall[c].Store(true)
			timeline = append(timeline, fmt.Sprintf("%v client %d to stall", time.Since(start).Round(time.Millisecond), c))
		}
		before := messages.Load()
		time.Sleep(s.quiet(rng))
		quietMessages = append(quietMessages, messages.Load()-before)
	}
	stop()
	wg.Wait()
	elapsed := time.Since(start)

	violations, fig := checkHistory(holds, resource.writes, func(from, to time.Time) time.Duration {
		return chaosSlack + probe.longest(from, to)
	})
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
	var spied spyFigures
	for _, c := range spies {
		for _, b := range c {
			spied.add(b)
		}
	}
	if s.nodes > 1 && spied.granted > 0 {
		violations = append(violations, fmt.Sprintf("releases granted the lock %d times over a quorum", spied.granted))
	}
	figures := fmt.Sprintf("%v, %d clients on %d servers: %d acquisitions, %d lost, %d stale writes rejected, latest Lost() %v after until (longest process stall %v); faults (servers hit, by kind) %v, client stalls %d; errors %v; violations %d",
		elapsed.Round(time.Second), chaosClients, s.nodes, fig.holds, fig.lost, fig.staleRejected, fig.maxLate.Round(time.Millisecond), probe.longest(start, time.Now()).Round(time.Millisecond), faults, stalls.Load(), errs, len(violations))
	if s.nodes == 1 {
		slices.Sort(quietMessages)
		adopted := 0
		for _, p := range paths {
			if p == byAdoption {
				adopted++
			}
		}
		figures += fmt.Sprintf("; by grant: %d holds by message (no round trip), %d adopted by a round, of %d grants that replies told of; %d queued waiters nobody listened for skipped; holds by message in a quiet time: fewest %d, median %d",
			messages.Load(), adopted, spied.granted, spied.skipped, quietMessages[0], quietMessages[len(quietMessages)/2])
	}
	reportFigures(t, "%s", figures)
	for i, h := range holds {
		if late := h.lostAt.Sub(h.until); h.signalled() && late > chaosSlack/2 {
			t.Logf("hold %d: client %d (%s), paused %v: held %v, Lost() %v after until, process stalled %v meanwhile, unlock %v",
				i, h.client, []string{"redigo", "rueidis"}[h.client%2], h.paused, h.end.Sub(h.start), late,
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

// A holdPath is how a hold came.
type holdPath int

const (
	byRound    holdPath = iota // an acquire round took the free lock
	byAdoption                 // an acquire round found a grant a release made us, and adopted it
	byMessage                  // a release granted it, and its message said so: no round trip
)

func (p holdPath) String() string {
	return [...]string{"round", "adoption", "message"}[p]
}

// spyBackend is one client's Backend on one server as the chaos test sees
// it: it forwards everything, pub/sub and the telling of final errors
// included, so that the client behaves as on the Backend itself, and notes
// what the acquire, release and leave scripts answered.
type spyBackend struct {
	Backend

	mu      sync.Mutex
	taken   uint64 // the token of the latest acquire that took the lock or adopted a grant
	adopted bool   // that acquire adopted a grant
	// granted counts the releases and leaves that granted the lock to a
	// waiter (see lua/handon.lua); not those whose reply a fault lost.
	granted int
	skipped int // queued waiters they skipped, nobody listening for them
}

func (b *spyBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	vals, err := b.Backend.Eval(ctx, s, keys, args)
	if err != nil {
		return vals, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case s == acquireScript && len(vals) == 3 && vals[0] == statusOK:
		b.taken, b.adopted = uint64(vals[1]), vals[2] > 0
	case (s == releaseScript || s == leaveScript) && len(vals) == 4:
		b.granted += int(vals[2])
		b.skipped += int(vals[3])
	}
	return vals, err
}

func (b *spyBackend) Hub() *Hub {
	if s, ok := b.Backend.(Subscriber); ok {
		return s.Hub()
	}
	return nil
}

func (b *spyBackend) Final(err error) bool {
	f, ok := b.Backend.(ErrorClassifier)
	return ok && f.Final(err)
}

// path tells how the client's hold with token came, just after its LockCtx
// returned: a hold no acquire reply gave us came by a release's message.
// (Tokens are unique: a grant's token is not that of an earlier reply.)
func (b *spyBackend) path(token uint64) holdPath {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.taken != token:
		return byMessage
	case b.adopted:
		return byAdoption
	}
	return byRound
}

// spyFigures sums what spyBackends saw.
type spyFigures struct{ granted, skipped int }

func (f *spyFigures) add(b *spyBackend) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f.granted += b.granted
	f.skipped += b.skipped
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
				i, h.client, []string{"redigo", "rueidis"}[h.client%2], h.token, paths[i], at(h.start), h.validAtStart,
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
// calling goroutine, inside the critical section, sleeps.
func pauseClient(t *testing.T, links []*redistest.ToxiProxy, d time.Duration) {
	for _, p := range links {
		if err := p.Add("stall", redistest.Latency("upstream", int(10*chaosExpiry/time.Millisecond), 0)); err != nil {
			t.Error(err)
		}
	}
	time.Sleep(d)
	for _, p := range links {
		p.Remove("stall") // what was held back is delivered now, late
	}
}

// waitReapersDone waits until no reaper of ms runs: after their clients
// are closed, each ends at its next pass (every call then fails for good).
func waitReapersDone(t *testing.T, ms []*NetMutex) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, m := range ms {
		for m != nil {
			m.reaper.mu.Lock()
			running, pending := m.reaper.running, len(m.reaper.pending)
			m.reaper.mu.Unlock()
			if !running {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("a reaper still runs 5s after its clients were closed, %d releases pending", pending)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// holdUntil returns the local deadline of m's current hold (zero if none).
func holdUntil(m *NetMutex) time.Time {
	if h := m.current(); h != nil {
		until, _ := h.deadline()
		return until
	}
	return time.Time{}
}

// isOpen reports whether c is not closed.
func isOpen(c <-chan struct{}) bool {
	select {
	case <-c:
		return false
	default:
		return true
	}
}

// errKind names an error by the sentinels it matches, for counting.
func errKind(err error) string {
	var kinds []string
	for _, s := range []struct {
		err  error
		name string
	}{
		{ErrNotObtained, "ErrNotObtained"}, {ErrNotHeld, "ErrNotHeld"}, {ErrLockLost, "ErrLockLost"},
		{ErrQuorum, "ErrQuorum"}, {context.Canceled, "Canceled"}, {context.DeadlineExceeded, "DeadlineExceeded"},
	} {
		if errors.Is(err, s.err) {
			kinds = append(kinds, s.name)
		}
	}
	if len(kinds) == 0 {
		return "UNDOCUMENTED " + err.Error()
	}
	return strings.Join(kinds, "+")
}
