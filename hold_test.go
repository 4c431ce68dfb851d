package netlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// Many holds in one process. The watchdogs of holds taken together must not
// extend together, each on a connection of its own: on a pool without a
// bound (redigo's MaxActive 0) that dialed thousands of connections, up to
// the server's maxclients, and holds were lost.
//
// By default the test holds manyHolds for manyHoldsFor; the soak run is
//
//	NETLOCK_HOLDS=10000 NETLOCK_HOLDS_FOR=60s NETLOCK_HOLDS_EXPIRY=10s go test -run TestManyHolds -v .
const (
	manyHolds       = 2000
	manyHoldsFor    = 8 * time.Second
	manyHoldsExpiry = 3 * time.Second
	// maxServerConns is what the holds may cost the server: the calls of a
	// Backend in flight (maxCalls), the test's own INFO, and connections
	// the client has closed and the server not yet seen closed. (Without a
	// bound on the calls in flight, a redigo pool without a bound of its own
	// used thousands, up to the server's maxclients, 10,000.)
	maxServerConns = 256
	// sampleEvery: how often the test samples the server's connections and
	// the process's goroutines.
	sampleEvery = 10 * time.Millisecond
)

// The phases of a run of holdMany.
const (
	acquiring = iota
	holding
	unlocking
)

// manyHoldsRun is what one run of holdMany measured.
type manyHoldsRun struct {
	holds        int
	held         time.Duration // from the last acquire to the first unlock
	notAcquired  int           // LockCtx failed
	lost         int           // Observer.Lost calls
	gone         int           // UnlockCtx found the key gone or taken (ErrLockLost)
	unlockErrs   int           // other UnlockCtx errors: the release is the reaper's to deliver
	extends      int64         // successful extends while all were held
	extendTook   time.Duration // their mean duration
	peakConns    [3]int        // connected_clients, sampled, while acquiring, holding, unlocking
	peakRoutines int           // runtime.NumGoroutine while all were held, sampled
	acquireTook  time.Duration
}

func (r manyHoldsRun) extendsPerSecond() float64 { return float64(r.extends) / r.held.Seconds() }

// extendsInFlight is the mean number of extends in flight (Little's law):
// how many a batch of the extends in flight at once could hold.
func (r manyHoldsRun) extendsInFlight() float64 { return r.extendsPerSecond() * r.extendTook.Seconds() }

func TestManyHolds(t *testing.T) {
	n, holdFor, expiry := manyHolds, manyHoldsFor, manyHoldsExpiry
	if v := os.Getenv("NETLOCK_HOLDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("NETLOCK_HOLDS=%q: want a positive number", v)
		}
	}
	envDuration(t, "NETLOCK_HOLDS_FOR", &holdFor)
	envDuration(t, "NETLOCK_HOLDS_EXPIRY", &expiry)
	for _, client := range []string{"redigo", "rueidis"} {
		t.Run(client, func(t *testing.T) {
			s := redistest.Start(t)
			r := holdMany(t, manyHoldsBackend(t, client, s.Addr()), s, n, holdFor, expiry)
			want := float64(n) / (expiry / extendsPerExpiry).Seconds()
			redistest.Report(t, "%d holds (expiry %v) for %v on %s: acquired in %v, %d not acquired, %d lost (%d keys gone), %d releases left to the reaper, peak %d server connections (acquiring %d, holding %d, unlocking %d), peak %d goroutines while held, %.0f extends/s (holds/(expiry/3) = %.0f), each %v, %.2f in flight",
				n, expiry, r.held.Round(100*time.Millisecond), client, r.acquireTook.Round(10*time.Millisecond), r.notAcquired, r.lost, r.gone, r.unlockErrs, slices.Max(r.peakConns[:]), r.peakConns[acquiring], r.peakConns[holding], r.peakConns[unlocking], r.peakRoutines, r.extendsPerSecond(), want, r.extendTook.Round(time.Microsecond), r.extendsInFlight())
			// A release left to the reaper (its node timeout passed on a
			// machine too loaded to read the reply in time, as under -race
			// in CI) is delivered later: reported, not a failure.
			if r.notAcquired > 0 || r.lost > 0 || r.gone > 0 {
				t.Errorf("got %d not acquired, %d lost, %d keys gone; want none", r.notAcquired, r.lost, r.gone)
			}
			if p := slices.Max(r.peakConns[:]); p > maxServerConns {
				t.Errorf("got a peak of %d server connections, want at most %d", p, maxServerConns)
			}
			if got := r.extendsPerSecond(); got < 0.8*want || got > 1.5*want {
				t.Errorf("got %.0f extends/s, want about holds/(expiry/3) = %.0f (0.8 to 1.5 times)", got, want)
			}
		})
	}
}

func envDuration(t *testing.T, name string, d *time.Duration) {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		var err error
		if *d, err = time.ParseDuration(v); err != nil || *d <= 0 {
			t.Fatalf("%s=%q: want a positive duration", name, v)
		}
	}
}

// manyHoldsBackend returns a Backend of client on addr whose pool has no
// bound of its own: redigo with MaxActive 0, rueidis as it comes.
func manyHoldsBackend(t *testing.T, client, addr string) Backend {
	t.Helper()
	switch client {
	case "redigo":
		pool := &redis.Pool{
			MaxIdle:   16,
			MaxActive: 0, // no bound
			Dial: func() (redis.Conn, error) {
				return redis.Dial("tcp", addr, redis.DialConnectTimeout(time.Second))
			},
		}
		t.Cleanup(func() { pool.Close() })
		return NewRedigo(pool)
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%s): %v", addr, err)
		}
		t.Cleanup(c.Close)
		return NewRueidis(c)
	}
	t.Fatalf("unknown client %q", client)
	return nil
}

// holdMany takes n locks of distinct names on b at once, holds them all for
// holdFor, and unlocks them, sampling the server's connections and the
// process's goroutines meanwhile.
func holdMany(t *testing.T, b Backend, s *redistest.Server, n int, holdFor, expiry time.Duration) (r manyHoldsRun) {
	t.Helper()
	r.holds = n
	var lost, gone, extends, extendNS, unlockErrs atomic.Int64
	var phase atomic.Int32 // acquiring, holding or unlocking
	obs := Observer{
		Lost: func(LostHold) { lost.Add(1) },
		Extend: func(_ context.Context, x ExtendDone) {
			if x.Err == nil && phase.Load() == holding {
				extends.Add(1)
				extendNS.Add(int64(x.Took))
			}
		},
	}
	quiet := slog.New(slog.DiscardHandler) // lost holds are counted, not logged
	ms := make([]*NetMutex, n)
	for i := range ms {
		m, err := New(fmt.Sprintf("many:%d", i), []Backend{b}, WithExpiry(expiry), WithObserver(obs), WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		ms[i] = m
	}

	stop := make(chan struct{})
	var peakConns [3]atomic.Int64
	var peakRoutines atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			p := phase.Load()
			peakConns[p].Store(max(peakConns[p].Load(), connectedClients(s)))
			if p == holding {
				peakRoutines.Store(max(peakRoutines.Load(), int64(runtime.NumGoroutine())))
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	defer func() {
		close(stop)
		sampler.Wait()
		for p := range peakConns {
			r.peakConns[p] = int(peakConns[p].Load())
		}
		r.peakRoutines = int(peakRoutines.Load())
	}()

	start := time.Now()
	acquired := make([]bool, n)
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 4*expiry)
			defer cancel()
			acquired[i] = m.LockCtx(ctx) == nil
		})
	}
	wg.Wait()
	r.acquireTook = time.Since(start)
	phase.Store(holding)
	held := time.Now()
	time.Sleep(holdFor) // the holds last that long: the point of the test
	phase.Store(unlocking)
	r.held = time.Since(held)
	r.extends = extends.Load()
	if r.extends > 0 {
		r.extendTook = time.Duration(extendNS.Load() / r.extends)
	}

	for i, m := range ms {
		if !acquired[i] {
			r.notAcquired++
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), expiry)
			defer cancel()
			switch err := m.UnlockCtx(ctx); {
			case errors.Is(err, ErrLockLost):
				gone.Add(1)
			case err != nil:
				unlockErrs.Add(1)
			}
		})
	}
	wg.Wait()
	r.lost, r.gone, r.unlockErrs = int(lost.Load()), int(gone.Load()), int(unlockErrs.Load())
	return r
}

// TestLostOnTimeWithExtendStuck: Lost() closes at the hold's local
// deadline even while an extend is stuck past it.
func TestLostOnTimeWithExtendStuck(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		const expiry = 300 * time.Millisecond
		m, err := New("stuck", []Backend{&stuckExtends{Backend: e.backend(t), stuck: 3 * time.Second}}, WithExpiry(expiry))
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, m)
		start := time.Now()
		select {
		case <-m.Lost():
			if d := time.Since(start); d > 2*expiry {
				t.Errorf("Lost() closed %v after the lock, its expiry %v", d, expiry)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Lost() not closed while the extend was stuck past the deadline")
		}
		m.UnlockCtx(context.Background()) // waits for the stuck extend
	})
}

// TestLostOnTimeWithExtendStuckAndMoved: while the watchdog's extend is
// stuck past the hold's deadline, another extend moves the deadline later;
// Lost() closes at the new deadline, not when the stuck extend comes back.
func TestLostOnTimeWithExtendStuckAndMoved(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		const expiry = 300 * time.Millisecond
		b := &stuckExtends{Backend: e.backend(t), stuck: 3 * time.Second, first: true}
		m, err := New("stuckmoved", []Backend{b}, WithExpiry(expiry))
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, m)
		start := time.Now()
		eventually(t, 5*time.Second, "the watchdog's extend under way", func() bool { return b.calls.Load() == 1 })
		if err := m.ExtendCtx(context.Background()); err != nil {
			t.Fatalf("ExtendCtx beside the stuck extend: %v", err)
		}
		extended := time.Now()
		until, _ := m.current().deadline()
		select {
		case <-m.Lost():
			if now := time.Now(); now.Before(until) {
				t.Errorf("Lost() closed %v before the deadline ExtendCtx set", until.Sub(now))
			}
		case <-time.After(time.Until(until) + time.Second):
			t.Fatalf("Lost() still open 1s after the deadline ExtendCtx set (%v after it returned, %v after the lock): it waits for the stuck extend",
				until.Sub(extended), until.Sub(start))
		}
		m.UnlockCtx(context.Background()) // waits for the stuck extend
	})
}

// TestWatchdogTicksEveryArmedHold: a NetMutex's watchdog timer is shared by
// its holds. A Semaphore's (or NetRWMutex's) new lease can begin before the
// last one has ended, and that one's tick, finishing, arms it again after
// the new one: the timer must still tick the new lease (here: close its
// Lost() at its deadline), not only the hold armed last.
func TestWatchdogTicksEveryArmedHold(t *testing.T) {
	m, err := New("watched", []Backend{newBackend(t, "redigo", miniredis.RunT(t).Addr())}, WithAutoExtend(false))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old := newHold(m.engine, grant{value: "old", start: now, until: now.Add(time.Hour)})
	lease := newHold(m.engine, grant{value: "new", start: now, until: now.Add(100 * time.Millisecond)})
	old.mu.Lock()
	m.dog.arm(old, old.wakeLocked()) // as old's tick does when it ends
	old.mu.Unlock()
	select {
	case <-lease.lostChan():
	case <-time.After(5 * time.Second):
		t.Fatal("the new lease's Lost() did not close at its deadline: the watchdog ticks only the hold armed last")
	}
	if old.end() {
		t.Error("the old hold, its deadline an hour away, was lost")
	}
	lease.end()
	m.dog.mu.Lock()
	defer m.dog.mu.Unlock()
	if len(m.dog.watched) != 0 {
		t.Errorf("%d holds left on the watchdog's list after both ended", len(m.dog.watched))
	}
}
