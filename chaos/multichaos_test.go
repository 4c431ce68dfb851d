package chaos

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/chaos/internal/toxi"
	"github.com/netlock-go/netlock/internal/redistest"
)

// multiNames are the lock names of the MultiMutex chaos tests: one hash
// tag, so that a set of them is one script per node.
var multiNames = []string{"{m}a", "{m}b", "{m}c"}

// A multiLock is one lock object a chaos client takes: a MultiMutex over
// some of multiNames (in an order of its own), or a NetMutex of one of
// them, with the upper bound of its current hold's local deadline.
type multiLock struct {
	names  []string
	lock   func(context.Context) error
	unlock func(context.Context) error
	lost   func() <-chan struct{}
	tokens func() []uint64
	bound  *deadlineBound
}

// A deadlineBound is an upper bound of a hold's local deadline, from its
// Observer's events alone: an acquire or extend round that ended by t
// gives a deadline of at most t + expiry − drift term (the engine counts
// the validity from the round's start, less the round's time). The late
// Lost() check is then never stricter than the engine, and may be looser.
type deadlineBound struct {
	expiry time.Duration // the expiry less the drift term
	mu     sync.Mutex
	until  time.Time
}

func (b *deadlineBound) observer() netlock.Observer {
	return netlock.Observer{
		Acquire: func(ctx context.Context, _ netlock.AcquireStart) (context.Context, func(netlock.AcquireDone)) {
			return ctx, func(d netlock.AcquireDone) {
				if d.Acquired {
					b.mu.Lock()
					b.until = time.Now().Add(b.expiry)
					b.mu.Unlock()
				}
			}
		},
		Extend: func(_ context.Context, x netlock.ExtendDone) {
			if x.Err == nil {
				b.mu.Lock()
				b.until = time.Now().Add(b.expiry)
				b.mu.Unlock()
			}
		},
	}
}

func (b *deadlineBound) deadline() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.until
}

// multiLocks returns client i's lock objects on backends: MultiMutexes of
// two and three names in different orders, and NetMutexes of single names,
// which a MultiMutex of the same names excludes.
func multiLocks(t *testing.T, backends []netlock.Backend) []multiLock {
	t.Helper()
	return namedLocks(t, backends, [][]string{{"{m}a", "{m}b"}, {"{m}c", "{m}b", "{m}a"}, {"{m}c", "{m}b"}, {"{m}a", "{m}c"}}, []string{"{m}b", "{m}a"})
}

// TestChaosMulti runs TestChaos's faults (a minority of three servers)
// against eight clients that take MultiMutexes over two or three of three
// names, in different orders, and NetMutexes of single names. Every
// critical section writes to one fenced resource per name it holds, with
// that name's token, twice, with a stall past the expiry now and then in
// between. Each name's history is checked as TestChaos's (checkHistory):
// no overlap of holds never reported lost, tokens increasing, every stale
// write refused, Lost() in time; with the local deadline bounded from the
// Observer's events (see deadlineBound) rather than worked out from the
// scripts' calls. No key may be left on a server once the clients stop.
func TestChaosMulti(t *testing.T) {
	runChaosLocks(t, multiSetup, chaosSetup{
		nodes:   3,
		victims: func(rng *rand.Rand) []int { return []int{rng.IntN(3)} },
		quiet:   func(rng *rand.Rand) time.Duration { return time.Duration(rng.IntN(300)) * time.Millisecond },
	})
}

// TestChaosMultiSingle is TestChaosMulti on one server.
func TestChaosMultiSingle(t *testing.T) {
	runChaosLocks(t, multiSetup, chaosSetup{
		nodes:   1,
		victims: func(*rand.Rand) []int { return []int{0} },
		quiet:   func(rng *rand.Rand) time.Duration { return chaosQuiet + time.Duration(rng.Int64N(int64(chaosQuiet))) },
	})
}

// A locksSetup is what a chaos test of lock objects (multiLock) takes:
// its names (one fenced resource and history each), the keys that must
// not outlive the clients, and each client's lock objects.
type locksSetup struct {
	what  string // for the report
	names []string
	keys  []string
	locks func(t *testing.T, backends []netlock.Backend) []multiLock
	// contended: every client waits for the one name whenever it does
	// not hold it, so that the name is never free for long (checkFreed).
	contended bool
}

var multiSetup = locksSetup{
	what:  fmt.Sprintf("MultiMutexes of 2 and 3 of %d names and NetMutexes", len(multiNames)),
	names: multiNames,
	keys:  []string{lockKey(multiNames[0]), lockKey(multiNames[1]), lockKey(multiNames[2])},
	locks: multiLocks,
}

// multiHistory is the history of every name: its holds and its fenced
// resource.
type multiHistory struct {
	mu        sync.Mutex
	holds     map[string][]holdRecord
	resources map[string]*fencedResource
	errs      map[string]int
	sections  int // acquisitions of a lock object
}

func newMultiHistory(names []string) *multiHistory {
	h := &multiHistory{holds: map[string][]holdRecord{}, resources: map[string]*fencedResource{}, errs: map[string]int{}}
	for _, n := range names {
		h.resources[n] = &fencedResource{}
	}
	return h
}

func (h *multiHistory) count(what string, err error) {
	h.mu.Lock()
	h.errs[what+": "+errKind(err)]++
	h.mu.Unlock()
}

// section runs one critical section of client i under l: it records a
// hold per name, writes to each name's resource twice, and unlocks.
func (h *multiHistory) section(i int, l multiLock, rng *rand.Rand, stall func() bool, pause func()) {
	tokens := l.tokens()
	lost := l.lost()
	if slices.Contains(tokens, 0) && !isOpen(lost) {
		// Lost between the acquire and the look at its token (an
		// Election's term reads 0 once it no longer leads): nothing to
		// write with.
		if err := l.unlock(context.Background()); err != nil {
			h.count("unlock", err)
		}
		h.mu.Lock()
		h.errs["lost before its token was read"]++
		h.mu.Unlock()
		return
	}
	start := time.Now()
	rec := holdRecord{client: i, start: start, validAtStart: isOpen(lost)}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		<-lost // closed at the latest by UnlockCtx
		rec.lostAt = time.Now()
	}()
	ids := make([]int, len(l.names))
	h.mu.Lock()
	h.sections++
	for k, n := range l.names {
		ids[k] = len(h.holds[n])
		h.holds[n] = append(h.holds[n], holdRecord{}) // filled in below
	}
	h.mu.Unlock()
	for k, n := range l.names {
		h.resources[n].read(ids[k])
		h.resources[n].write(ids[k], tokens[k])
	}
	time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	if stall() {
		rec.paused = true
		pause()
	}
	for k, n := range l.names {
		h.resources[n].write(ids[k], tokens[k])
	}
	rec.end = time.Now()
	rec.validAtEnd = isOpen(lost)
	rec.unlockStart = time.Now()
	rec.unlockErr = l.unlock(context.Background())
	rec.until = l.bound.deadline() // every extend has ended with UnlockCtx
	<-watched
	if rec.unlockErr != nil {
		h.count("unlock", rec.unlockErr)
	}
	h.mu.Lock()
	for k, n := range l.names {
		r := rec
		r.token = tokens[k]
		h.holds[n][ids[k]] = r
	}
	h.mu.Unlock()
}

// runChaosLocks runs a chaos test of ls's lock objects on s's servers, as
// TestChaosMulti describes it.
func runChaosLocks(t *testing.T, ls locksSetup, s chaosSetup) {
	duration := chaosDuration(t)
	t.Cleanup(func() { waitNetlockDone(t, 5*time.Second) })
	servers := deploy(t, s)
	x := toxi.New(t)
	links := make([][]*toxi.Proxy, chaosClients) // [client][node]
	for i := range links {
		for _, srv := range servers {
			links[i] = append(links[i], x.Proxy(srv.Addr()))
		}
	}
	locks := make([][]multiLock, chaosClients)
	for i := range locks {
		locks[i] = ls.locks(t, clientBackends(t, s, i, servers, links[i]))
	}

	hist := newMultiHistory(ls.names)
	var stalls atomic.Int64
	stall := make([]atomic.Bool, chaosClients)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var probe stallProbe
	wg.Go(func() { probe.run(ctx) })
	for i := range locks {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				l := locks[i][rng.IntN(len(locks[i]))]
				lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err := l.lock(lctx)
				cancel()
				if err != nil {
					hist.count("lock", err)
					continue
				}
				hist.section(i, l, rng, func() bool { return stall[i].CompareAndSwap(true, false) }, func() {
					stalls.Add(1)
					pauseClient(links[i], chaosExpiry*3/2+time.Duration(rng.IntN(500))*time.Millisecond, nil)
				})
			}
		})
	}
	start := time.Now()
	faults, timeline, episodes := runFaults(t, s, servers, links, stall, start, duration, time.Sleep)
	stopping := time.Now()
	stop()
	wg.Wait()
	elapsed := time.Since(start)

	var violations []string
	slack := func(from, to time.Time) time.Duration { return chaosSlack + probe.longest(from, to) }
	var held, lost, stale int
	var late time.Duration
	var freedMax time.Duration
	linearizable := map[porcupine.CheckResult]int{} // names by porcupine's result
	var calls int
	for _, n := range ls.names {
		v, fig := checkHistory(hist.holds[n], hist.resources[n].writes, slack)
		if ls.contended {
			freed, longest := checkFreed(holdSpans(hist.holds[n]), 1, 1, episodes, start, stopping, slack)
			v = append(v, freed...)
			freedMax = max(freedMax, longest)
		}
		result, notLinearizable := checkLinearizable(n, hist.resources[n].ops)
		linearizable[result]++
		calls += len(hist.resources[n].ops)
		violations = append(violations, notLinearizable...)
		for _, line := range v {
			violations = append(violations, n+": "+line)
		}
		for _, h := range hist.holds[n] {
			if h.token == 0 {
				violations = append(violations, fmt.Sprintf("%s: client %d held with token 0", n, h.client))
			}
		}
		held, lost, stale, late = held+fig.holds, lost+fig.lost, stale+fig.staleRejected, max(late, fig.maxLate)
	}
	for _, k := range ls.keys {
		violations = append(violations, checkStranded(t, servers, k)...)
	}
	for _, e := range slices.Sorted(maps.Keys(hist.errs)) {
		if strings.Contains(e, "UNDOCUMENTED") {
			violations = append(violations, fmt.Sprintf("%d times %s", hist.errs[e], e))
		}
	}
	on := fmt.Sprintf("%d servers", s.nodes)
	if s.cluster {
		on = fmt.Sprintf("a Redis Cluster of %d masters", s.nodes)
	}
	freedFig := ""
	if ls.contended {
		freedFig = fmt.Sprintf("stranded after the fault cleared: max %v (bound %v); ", freedMax.Round(time.Millisecond), freedBound)
	}
	redistest.Report(t, "%v, %d clients on %s, %s: %d acquisitions, %d holds of a name (%d lost, %d stale writes rejected), latest Lost() %v after its deadline's bound (longest process stall %v); %slinearizable (porcupine, fenced register, names by result): %v, %d calls; faults %v, client stalls %d; errors %v; violations %d",
		elapsed.Round(time.Second), chaosClients, on, ls.what, hist.sections, held, lost, stale, late.Round(time.Millisecond),
		probe.longest(start, time.Now()).Round(time.Millisecond), freedFig, linearizable, calls, faults, stalls.Load(), hist.errs, len(violations))
	for i, v := range violations {
		if i == 20 {
			t.Errorf("... and %d more", len(violations)-i)
			break
		}
		t.Error(v)
	}
	if len(violations) > 0 {
		for _, f := range timeline {
			t.Logf("fault %s", f)
		}
	}
	if held < 10 {
		t.Errorf("only %d holds of a name: the locks made no progress between the faults", held)
	}
}
