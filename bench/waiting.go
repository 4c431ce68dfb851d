package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
)

// The waiting scenario: what clients waiting for a held lock cost
// Redis, in commands per waiter-second.
const (
	waitingClients = 40
	// waitWarmup lets every waiter subscribe, queue or start its retry
	// loop before the window opens.
	waitWarmup = time.Second
	// waitDrain bounds the hand-over to every waiter after the release;
	// waiters still waiting then are cancelled.
	waitDrain = 30 * time.Second
	// extendEvery is how often the holder extends, for libraries that do not
	// extend by themselves: as often as netlock's watchdog.
	extendEvery = lockExpiry / 3
	// leakWait is how long a row's goroutines and connections may take to
	// go after its clients are closed.
	leakWait = 5 * time.Second
)

// A waitResult is what one row of the waiting scenario measured.
type waitResult struct {
	waiters  int
	window   time.Duration // between the two INFO snapshots
	commands int64         // Redis commands in the window, the measuring connection's own left out
	top      []cmdCount    // the commands with most calls in the window, most first
	pings    int64         // PINGs among commands: a client library's own keepalive (rueidis), not the lock's
	served   int           // waiters that got the lock after the holder released it
	handover time.Duration // from the holder's unlock to the last served waiter's unlock returning
}

// perWaiterSecond is the figure of the scenario.
func (w *waitResult) perWaiterSecond() float64 { return w.perSecond(w.commands) / float64(w.waiters) }

// lockPerWaiterSecond is the figure without the PINGs a client library
// sends by itself to keep idle connections checked (rueidis: one per idle
// connection per second, its Dialer.KeepAlive): what the lock costs.
func (w *waitResult) lockPerWaiterSecond() float64 {
	return w.perSecond(w.commands-w.pings) / float64(w.waiters)
}

// perSecond is n over the window.
func (w *waitResult) perSecond(n int64) float64 {
	if w.window <= 0 {
		return 0
	}
	return float64(n) / w.window.Seconds()
}

type cmdCount struct {
	name  string
	calls int64
}

// waitingRow: a holder and waitingClients waiters on one lock. It connects
// in its phase, not in setup, so that only its own clients are connected to
// the server while it measures, and it can check that they are all gone
// when it ends.
func waitingRow(c *contender, addr string) *row {
	name := lockName(waitingID, c.name, 0, 0)
	return &row{name: c.name, c: c, na: c.noWait, note: c.waits, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		return func(ctx context.Context, window time.Duration, _ int) result {
			return runWaiting(ctx, c, addr, window, func(cls []client) (locker, []locker, error) {
				lockers, err := makeLockers(len(cls), func(i int) (locker, error) { return cls[i].locker(name) })
				if err != nil {
					return nil, nil, err
				}
				return lockers[0], lockers[1:], nil
			})
		}, func() {}, nil
	}}
}

// runWaiting measures one row of a waiting scenario: it connects the holder
// and the waiters (1+waitingClients clients of c), takes their lock objects
// from lockers (the holder's on cls[0], the waiters' on the others), runs
// them, closes them and checks that no goroutine or server connection is
// left behind.
func runWaiting(ctx context.Context, c *contender, addr string, window time.Duration, lockers func(cls []client) (holder locker, waiters []locker, err error)) result {
	var res result
	probe, err := dialProbe(addr)
	if err != nil {
		res.addErr(err)
		return res
	}
	defer probe.Close()
	goroutines := runtime.NumGoroutine()
	conns, err := connectedClients(probe)
	if err != nil {
		res.addErr(err)
		return res
	}

	cls, closeAll, err := connectN(c, []string{addr}, 1+waitingClients)
	if err != nil {
		res.addErr(err)
		return res
	}
	var w *waitResult
	holder, waiters, err := lockers(cls)
	if err == nil {
		w, err = waitBehindHolder(ctx, holder, waiters, probe, window, &res)
	}
	closeAll()
	if err != nil {
		res.addErr(err)
	}
	res.wait = w
	if err := leftovers(probe, goroutines, conns); err != nil {
		res.addErr(err)
	}
	return res
}

// waitBehindHolder has holder take the lock and hold it while the waiters
// wait for it (each on its own client); it counts the commands Redis runs
// over the window after the warm-up, then releases, and returns once every
// waiter has had its turn (or was cancelled after waitDrain). Errors,
// gave-ups and overlaps go to res; err is what stopped the measurement.
func waitBehindHolder(ctx context.Context, holder locker, waiters []locker, probe redis.Conn, window time.Duration, res *result) (*waitResult, error) {
	// The holder's hold must outlive the waiters' context: rueidislock ends
	// a hold when the context it was taken with ends.
	release, err := hold(ctx, holder, res)
	if err != nil {
		return nil, fmt.Errorf("holder: %w", err)
	}
	var g guard // the holder is inside until it releases
	g.enter(reads(holder))
	released := false

	wctx, cancel := context.WithTimeout(ctx, waitWarmup+window+waitDrain)
	turns := make([]turn, len(waiters))
	var wg sync.WaitGroup
	defer func() {
		// On an early return, the waiters are cancelled and gone before the
		// holder releases.
		cancel()
		wg.Wait()
		if !released {
			release()
		}
	}()
	for i, l := range waiters {
		wg.Go(func() { turns[i] = waitTurn(wctx, l, &g) })
	}

	w := &waitResult{waiters: len(turns)}
	if !sleepCtx(wctx, waitWarmup) {
		return nil, ctx.Err()
	}
	before, err := readCommandStats(probe)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if !sleepCtx(wctx, window) {
		return nil, ctx.Err()
	}
	after, err := readCommandStats(probe)
	if err != nil {
		return nil, err
	}
	w.window = time.Since(t0)
	w.commands, w.top = after.since(before)
	w.pings = after.calls["ping"] - before.calls["ping"]

	g.leave(reads(holder))
	unlocked := time.Now()
	release()
	released = true
	wg.Wait()
	for _, t := range turns {
		res.merge(t.res)
		if t.served {
			w.served++
			w.handover = max(w.handover, t.done.Sub(unlocked))
		}
	}
	return w, nil
}

// hold takes the lock for the holder. For a library that does not extend a
// hold by itself, it extends it every extendEvery until release, so that the
// hold outlives its key's expiry as netlock's and rueidislock's do, and the
// window includes what the waiters do when it is extended.
func hold(ctx context.Context, l locker, res *result) (release func(), err error) {
	e, ok := l.(extendable)
	if !ok {
		unlock, err := l.lock(ctx)
		if err != nil {
			return nil, err
		}
		return func() { res.addIfErr(unlock(context.Background())) }, nil
	}
	unlock, extend, err := e.lockExtendable(ctx)
	if err != nil {
		return nil, err
	}
	stop, stopped := make(chan struct{}), make(chan []error)
	go func() {
		var errs []error
		t := time.NewTicker(extendEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				stopped <- errs
				return
			case <-t.C:
				ectx, cancel := context.WithTimeout(context.Background(), ioTimeout)
				if err := extend(ectx); err != nil {
					errs = append(errs, fmt.Errorf("holder's extend: %w", err))
				}
				cancel()
			}
		}
	}()
	return func() {
		// No extend may run on the hold once unlock has started.
		close(stop)
		for _, err := range <-stopped {
			res.addErr(err)
		}
		res.addIfErr(unlock(context.Background()))
	}, nil
}

// A turn is one waiter's wait.
type turn struct {
	served bool
	done   time.Time // when its unlock returned
	res    result    // gave-ups, errors, overlaps
}

// waitTurn waits for the lock with the library's blocking lock, calling it
// again when it gives up, until it gets the lock or ctx ends. With the lock,
// it checks with g that nobody it must exclude is inside (the holder counts
// until it releases; a reader excludes writers only), and unlocks at once.
func waitTurn(ctx context.Context, l locker, g *guard) (t turn) {
	read := reads(l)
	for {
		unlock, err := l.lock(ctx)
		if err == nil {
			if !g.enter(read) {
				t.res.overlaps++
			}
			g.leave(read)
			t.res.addIfErr(unlock(context.Background()))
			t.served, t.done = true, time.Now()
			return t
		}
		switch {
		case ctx.Err() != nil:
			return t // cancelled: not served after waitDrain
		case errors.Is(err, errBusy):
			t.res.busy++
		default:
			t.res.addErr(err)
			time.Sleep(errorPause)
		}
	}
}

// A guard counts who is inside a lock's critical sections, to catch a lock
// that lets in someone it must exclude: a writer (every holder of a plain
// lock) must be alone, readers may be in together but never with a writer.
// Each side adds itself before it looks at the other, so of a reader and a
// writer entering at once at least one sees the other.
type guard struct{ readers, writers atomic.Int32 }

// enter counts one more reader (read) or writer inside, and reports whether
// it may be there with those already inside.
func (g *guard) enter(read bool) (ok bool) {
	if read {
		g.readers.Add(1)
		return g.writers.Load() == 0
	}
	return g.writers.Add(1) == 1 && g.readers.Load() == 0
}

// still reports whether one reader (read) or writer inside may still be
// there: whether someone it excludes came in meanwhile.
func (g *guard) still(read bool) bool {
	if read {
		return g.writers.Load() == 0
	}
	return g.writers.Load() == 1 && g.readers.Load() == 0
}

func (g *guard) leave(read bool) {
	if read {
		g.readers.Add(-1)
	} else {
		g.writers.Add(-1)
	}
}

// A readLocker is a locker that takes a lock for reading, shared with other
// readers; every other locker is a writer.
type readLocker interface {
	locker
	reads() bool
}

func reads(l locker) bool {
	r, ok := l.(readLocker)
	return ok && r.reads()
}

// sleepCtx sleeps for d, or less if ctx ends first; it reports whether it
// slept the whole d.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// connectN connects n clients of c, each its own as a separate process
// would have, and returns them with a function that closes them all.
func connectN(c *contender, addrs []string, n int) ([]client, func(), error) {
	cls := make([]client, 0, n)
	closeAll := func() {
		for _, cl := range cls {
			cl.close()
		}
	}
	for range n {
		cl, err := c.connect(addrs)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		cls = append(cls, cl)
	}
	return cls, closeAll, nil
}

// Measuring the server.

// dialProbe opens the measuring connection: one plain connection that runs
// only INFO.
func dialProbe(addr string) (redis.Conn, error) {
	return redis.Dial("tcp", addr,
		redis.DialConnectTimeout(ioTimeout),
		redis.DialReadTimeout(ioTimeout),
		redis.DialWriteTimeout(ioTimeout))
}

// commandStats is one snapshot of the server's command counters.
type commandStats struct {
	total int64            // total_commands_processed
	calls map[string]int64 // calls per command, from INFO commandstats
	usec  map[string]int64 // µs of server time per command, from INFO commandstats
}

// readCommandStats takes both counters in one INFO (Redis 7 takes several
// sections), so that they agree with each other.
func readCommandStats(probe redis.Conn) (commandStats, error) {
	info, err := redis.String(probe.Do("INFO", "stats", "commandstats"))
	if err != nil {
		return commandStats{}, fmt.Errorf("INFO stats commandstats: %w", err)
	}
	return parseCommandStats(info)
}

func parseCommandStats(info string) (commandStats, error) {
	s := commandStats{total: -1, calls: map[string]int64{}, usec: map[string]int64{}}
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if k == "total_commands_processed" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return s, fmt.Errorf("INFO: %s: %w", line, err)
			}
			s.total = n
			continue
		}
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		// calls=N,usec=...,usec_per_call=...
		for field := range strings.SplitSeq(v, ",") {
			if n, ok := strings.CutPrefix(field, "calls="); ok {
				calls, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					return s, fmt.Errorf("INFO: %s: %w", line, err)
				}
				s.calls[name] = calls
			}
			if n, ok := strings.CutPrefix(field, "usec="); ok {
				usec, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					return s, fmt.Errorf("INFO: %s: %w", line, err)
				}
				s.usec[name] = usec
			}
		}
	}
	if s.total < 0 {
		return s, errors.New("INFO has no total_commands_processed")
	}
	return s, nil
}

// since returns the commands run between snapshot b and s, and the three
// with most calls. Each snapshot's own INFO is counted either in its own
// figures or in the next snapshot's, the same way every time, so exactly
// one of the pair falls between them: that one is left out.
func (s commandStats) since(b commandStats) (commands int64, top []cmdCount) {
	const ownInfo = 1
	for name, n := range s.calls {
		d := n - b.calls[name]
		if name == "info" {
			d -= ownInfo
		}
		if d > 0 {
			top = append(top, cmdCount{name, d})
		}
	}
	slices.SortFunc(top, func(x, y cmdCount) int {
		return cmp.Or(cmp.Compare(y.calls, x.calls), strings.Compare(x.name, y.name))
	})
	return s.total - b.total - ownInfo, top[:min(len(top), 3)]
}

// usecSince is the server time, in µs, the commands run between snapshot b
// and s took, INFO left out (its own and bench's).
func (s commandStats) usecSince(b commandStats) int64 {
	var us int64
	for name, n := range s.usec {
		if name != "info" {
			us += n - b.usec[name]
		}
	}
	return us
}

// connectedClients is the server's connected_clients.
func connectedClients(probe redis.Conn) (int, error) {
	info, err := redis.String(probe.Do("INFO", "clients"))
	if err != nil {
		return 0, fmt.Errorf("INFO clients: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO clients has no connected_clients")
}

// leftovers waits up to leakWait for the number of goroutines and of the
// server's connections to be back where they were before the row connected,
// and says what is left if they are not.
func leftovers(probe redis.Conn, goroutines, conns int) error {
	deadline := time.Now().Add(leakWait)
	for {
		n, err := connectedClients(probe)
		if err != nil {
			return err
		}
		g, c := runtime.NumGoroutine()-goroutines, n-conns
		if g <= 0 && c <= 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("left behind %v after closing every client: %d goroutines, %d server connections", leakWait, max(g, 0), max(c, 0))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fmtTop renders the top commands, per waiter-second.
func fmtTop(w *waitResult) string {
	var parts []string
	for _, c := range w.top {
		parts = append(parts, fmt.Sprintf("%s %s", c.name, fmtRate(w.perSecond(c.calls)/float64(w.waiters))))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
