package netlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// newOnce returns a Once on a backend of its own, as another process
// would have.
func (e *env) newOnce(t testing.TB, name string, opts ...Option) *Once {
	t.Helper()
	o, err := NewOnce(name, []Backend{e.backend(t)}, opts...)
	if err != nil {
		t.Fatalf("NewOnce(%q): %v", name, err)
	}
	return o
}

// onceKeys returns the keys of the Once name under the default prefix.
func onceKeys(name string) keyspace.OnceKeys { return keyspace.Once(DefaultPrefix, name, true) }

// onceQueued returns how many waiters the Once name's queue holds on e.
func (e *env) onceQueued(t testing.TB, name string) int {
	t.Helper()
	n, err := redis.Int(e.do(t, "ZCARD", onceKeys(name).Waiters), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mustDone fails the test unless o's Done says want.
func mustDone(t testing.TB, o *Once, want bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done, err := o.Done(ctx)
	if err != nil || done != want {
		t.Fatalf("Done: got %v, %v; want %v, nil", done, err, want)
	}
}

// A doResult is what one Do returned, and when.
type doResult struct {
	ran bool
	err error
	at  time.Time
}

// TestOnceRunsOnce: callers on clients of their own (as processes) Do at
// once: exactly one runs fn; the others wait in the lock's queue and return
// (false, nil) only after it finished. A later Do, and Done, say it is done.
func TestOnceRunsOnce(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const callers = 6
		onces := make([]*Once, callers)
		for i := range onces {
			onces[i] = e.newOnce(t, "migrate")
		}
		var runs atomic.Int32
		var finished atomic.Int64 // when fn returned, in ns since the epoch
		fn := func(ctx context.Context) error {
			runs.Add(1)
			// The others come while it runs: each waits in the queue.
			eventually(t, 10*time.Second, "the other callers queued", func() bool { return e.onceQueued(t, "migrate") == callers-1 })
			finished.Store(time.Now().UnixNano())
			return nil
		}
		results := make([]doResult, callers)
		var wg sync.WaitGroup
		for i, o := range onces {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				ran, err := o.Do(ctx, fn)
				results[i] = doResult{ran, err, time.Now()}
			})
		}
		wg.Wait()
		if n := runs.Load(); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		ran := 0
		for i, r := range results {
			switch {
			case r.err != nil:
				t.Errorf("caller %d: Do: %v", i, r.err)
			case r.ran:
				ran++
			case r.at.UnixNano() < finished.Load():
				t.Errorf("caller %d returned (false, nil) %v before the run finished", i, time.Unix(0, finished.Load()).Sub(r.at))
			}
		}
		if ran != 1 {
			t.Errorf("%d callers say they ran fn, want 1", ran)
		}
		mustDone(t, onces[0], true)
		if ran, err := onces[1].Do(context.Background(), func(context.Context) error { t.Error("fn ran again"); return nil }); ran || err != nil {
			t.Errorf("Do of a name done: got %v, %v; want false, nil", ran, err)
		}
		if e.exists(t, onceKeys("migrate").Lock) || e.exists(t, onceKeys("migrate").Waiters) {
			t.Error("the Once's lock or queue is left behind")
		}
		if e.exists(t, keyspace.New(DefaultPrefix, "migrate", false).Lock) {
			t.Error("a Once took the NetMutex's key of its name")
		}
	})
}

// TestOnceFailedRunNextRuns: a run that fails leaves the name not done; the
// caller that waited for it runs fn next, and its success is remembered.
func TestOnceFailedRunNextRuns(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		first, second, third := e.newOnce(t, "flaky"), e.newOnce(t, "flaky"), e.newOnce(t, "flaky")
		boom := errors.New("boom")
		started := make(chan struct{})
		failed := async(func(ctx context.Context) error {
			ran, err := first.Do(ctx, func(context.Context) error {
				close(started)
				eventually(t, 10*time.Second, "the second caller queued", func() bool { return e.onceQueued(t, "flaky") == 1 })
				return boom
			})
			if !ran {
				return fmt.Errorf("the first Do did not run fn: %v", err)
			}
			return err
		})
		<-started
		var secondRan atomic.Bool
		ran, err := second.Do(context.Background(), func(context.Context) error {
			secondRan.Store(true)
			return nil
		})
		if err := <-failed; !errors.Is(err, boom) {
			t.Fatalf("the failed run's Do: got %v, want fn's error", err)
		}
		if !ran || err != nil || !secondRan.Load() {
			t.Fatalf("the Do that waited for a failed run: got %v, %v (fn ran: %v); want true, nil", ran, err, secondRan.Load())
		}
		mustDone(t, third, true)
		if ran, err := third.Do(context.Background(), func(context.Context) error { return boom }); ran || err != nil {
			t.Errorf("Do after the success: got %v, %v; want false, nil", ran, err)
		}
	})
}

// frozenBackend answers nothing while frozen: each call waits for its
// context to end, as over a connection that stopped moving.
type frozenBackend struct {
	Backend
	frozen atomic.Bool
}

func (f *frozenBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if f.frozen.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return f.Backend.Eval(ctx, s, keys, args)
}

// TestOnceLostRunner: the runner's connection freezes while fn runs. Its
// hold is lost by its local clock (fn's context ends with ErrLockLost), its
// key expires in Redis, and the caller waiting runs fn within about an
// expiry. The lost runner's fn, which returns nil all the same, records
// nothing: Do says ErrLockLost, and the name is done only by the second
// run.
func TestOnceLostRunner(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const expiry = 500 * time.Millisecond
		opts := []Option{WithExpiry(expiry), WithNodeTimeout(100 * time.Millisecond)}
		fb := &frozenBackend{Backend: e.backend(t)}
		t.Cleanup(func() { fb.frozen.Store(false) }) // the release still owed is delivered
		runner, err := NewOnce("lost", []Backend{fb}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		waiter := e.newOnce(t, "lost", opts...)

		started, secondRan := make(chan struct{}), make(chan struct{})
		var frozeAt, lostAt time.Time
		first := async(func(ctx context.Context) error {
			ran, err := runner.Do(ctx, func(ctx context.Context) error {
				close(started)
				eventually(t, 10*time.Second, "the waiter queued", func() bool { return e.onceQueued(t, "lost") == 1 })
				frozeAt = time.Now()
				fb.frozen.Store(true)
				<-ctx.Done()
				lostAt = time.Now()
				if !errors.Is(context.Cause(ctx), ErrLockLost) {
					t.Errorf("fn's context ended with %v, want ErrLockLost", context.Cause(ctx))
				}
				if e.mini != nil {
					e.mini.FastForward(expiry) // the key expires in Redis
				}
				<-secondRan
				return nil // too late: the hold is lost
			})
			if !ran {
				return errors.New("the runner's Do did not run fn")
			}
			return err
		})
		<-started
		var ranAt time.Time
		ran, err := waiter.Do(context.Background(), func(context.Context) error {
			ranAt = time.Now()
			close(secondRan)
			return nil
		})
		if !ran || err != nil {
			t.Fatalf("the waiter's Do: got %v, %v; want true, nil", ran, err)
		}
		if err := <-first; !errors.Is(err, ErrLockLost) {
			t.Fatalf("the lost runner's Do: got %v, want ErrLockLost", err)
		}
		t.Logf("froze at 0, lost after %v, the waiter ran after %v", lostAt.Sub(frozeAt).Round(time.Millisecond), ranAt.Sub(frozeAt).Round(time.Millisecond))
		if d := ranAt.Sub(frozeAt); d > 4*expiry {
			t.Errorf("the waiter ran %v after the runner froze, want about an expiry (%v)", d, expiry)
		}
		mustDone(t, waiter, true)
	})
}

// TestOnceRecordNeedsTheHold: the record script writes only where the lock
// holds the caller's value and token; a runner whose hold expired, was
// taken, or whose token is not the key's records nothing.
func TestOnceRecordNeedsTheHold(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		b := e.backend(t)
		k := onceKeys("rec")
		record := func(value, token string) []int64 {
			return evalOK(t, b, onceRecordScript, []string{k.Lock, k.Done}, []string{value, token, "0", "web-1%2F42", "0"})
		}
		for _, c := range []struct {
			what, key, value, token string
			want                    int64
		}{
			{"absent", "", "v", "7", releaseAbsent},
			{"another value", "w:7:host", "v", "7", releaseOther},
			{"another token", "v:8:host", "v", "7", releaseOther},
			{"a value that starts with ours", "vv:7:host", "v", "7", releaseOther},
		} {
			e.do(t, "DEL", k.Lock, k.Done)
			if c.key != "" {
				e.do(t, "SET", k.Lock, c.key)
			}
			if got := record(c.value, c.token); got[0] != c.want {
				t.Errorf("%s: got %v, want {%d}", c.what, got, c.want)
			}
			if e.exists(t, k.Done) {
				t.Errorf("%s: recorded", c.what)
			}
		}
		e.do(t, "SET", k.Lock, "v:7:web-1%2F42+")
		if got := record("v", "7"); got[0] != releaseDone {
			t.Fatalf("our hold: got %v, want {1}", got)
		}
		rec, _ := redis.String(e.do(t, "GET", k.Done), nil)
		if parts := strings.SplitN(rec, ":", 3); len(parts) != 3 || parts[0] != "7" || parts[2] != "web-1%2F42" || len(parts[1]) < 13 {
			t.Errorf("the record: got %q, want 7:<unix ms>:web-1%%2F42", rec)
		}
		if ttl, _ := redis.Int(e.do(t, "PTTL", k.Done), nil); ttl != -1 {
			t.Errorf("the record's PTTL without WithRemember: got %d, want -1", ttl)
		}
		evalOK(t, b, onceRecordScript, []string{k.Lock, k.Done}, []string{"v", "7", "60000", "web-1%2F42", "0"})
		if ttl, _ := redis.Int(e.do(t, "PTTL", k.Done), nil); ttl <= 0 || ttl > 60000 {
			t.Errorf("the record's PTTL with 60000 ms: got %d", ttl)
		}
		// A copy, once a quorum recorded the run: whatever the lock holds.
		e.do(t, "DEL", k.Done)
		e.do(t, "SET", k.Lock, "w:9:other")
		if got := evalOK(t, b, onceRecordScript, []string{k.Lock, k.Done}, []string{"v", "7", "0", "web-1%2F42", "1"}); got[0] != releaseDone || !e.exists(t, k.Done) {
			t.Errorf("a copy: got %v (recorded: %v), want {1}, recorded", got, e.exists(t, k.Done))
		}
	})
}

// TestOnceRememberAndForget: WithRemember's record expires, and the next Do
// runs fn again; Forget makes the next Do run it again at once.
func TestOnceRememberAndForget(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const remember = 300 * time.Millisecond
		o := e.newOnce(t, "report", WithRemember(remember))
		var runs atomic.Int32
		count := func(context.Context) error { runs.Add(1); return nil }
		ctx := context.Background()
		if ran, err := o.Do(ctx, count); !ran || err != nil {
			t.Fatalf("first Do: got %v, %v; want true, nil", ran, err)
		}
		ttl, _ := redis.Int(e.do(t, "PTTL", onceKeys("report").Done), nil)
		if ttl <= 0 || ttl > int(remember/time.Millisecond) {
			t.Errorf("the record's PTTL: got %d ms, want at most %v", ttl, remember)
		}
		if ran, err := o.Do(ctx, count); ran || err != nil {
			t.Fatalf("Do while remembered: got %v, %v; want false, nil", ran, err)
		}
		if e.mini != nil {
			e.mini.FastForward(remember)
		}
		eventually(t, 5*time.Second, "the run forgotten after WithRemember's duration", func() bool {
			done, err := o.Done(ctx)
			return err == nil && !done
		})
		if ran, err := o.Do(ctx, count); !ran || err != nil {
			t.Fatalf("Do once forgotten: got %v, %v; want true, nil", ran, err)
		}

		forever := e.newOnce(t, "migrate")
		if ran, err := forever.Do(ctx, count); !ran || err != nil {
			t.Fatalf("Do: got %v, %v; want true, nil", ran, err)
		}
		if ttl, _ := redis.Int(e.do(t, "PTTL", onceKeys("migrate").Done), nil); ttl != -1 {
			t.Errorf("the record's PTTL without WithRemember: got %d, want -1 (until Forget)", ttl)
		}
		if err := forever.Forget(ctx); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		mustDone(t, forever, false)
		if ran, err := forever.Do(ctx, count); !ran || err != nil {
			t.Fatalf("Do after Forget: got %v, %v; want true, nil", ran, err)
		}
		if n := runs.Load(); n != 4 {
			t.Errorf("fn ran %d times, want 4", n)
		}
	})
}

// TestOnceSharedByGoroutines: goroutines of one process sharing the Once a
// Client gives them queue locally; one runs fn, the others return after it.
func TestOnceSharedByGoroutines(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		c, err := NewClient([]Backend{e.backend(t)})
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		release := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				o, err := c.Once("warm-cache")
				if err != nil {
					errs <- err
					return
				}
				_, err = o.Do(context.Background(), func(context.Context) error {
					runs.Add(1)
					<-release
					return nil
				})
				errs <- err
			})
		}
		eventually(t, 5*time.Second, "a goroutine running fn", func() bool { return runs.Load() == 1 })
		close(release)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("fn ran %d times, want 1", n)
		}
	})
}

// TestOnceQuorum: a Once over three independent servers, with clients of
// their own per caller: one caller runs fn; the record is on every server
// (copied to those of the quorum whose lock was not the runner's);
// with one server stopped, Done still tells (a majority holds the record),
// and Forget and a new run work on the two left.
func TestOnceQuorum(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			servers := startServers(t, 3)
			newQuorumOnce := func() *Once {
				backends := make([]Backend, len(servers))
				for i, s := range servers {
					backends[i] = newBackend(t, client, s.Addr())
				}
				o, err := NewOnce("schema", backends, WithExpiry(2*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				return o
			}
			var runs atomic.Int32
			var wg sync.WaitGroup
			for range 4 {
				o := newQuorumOnce()
				wg.Go(func() {
					if _, err := o.Do(context.Background(), func(context.Context) error {
						runs.Add(1)
						time.Sleep(50 * time.Millisecond) // the others come meanwhile
						return nil
					}); err != nil {
						t.Errorf("Do: %v", err)
					}
				})
			}
			wg.Wait()
			if n := runs.Load(); n != 1 {
				t.Fatalf("fn ran %d times over the quorum, want 1", n)
			}
			for i, s := range servers {
				if got, err := s.Do("EXISTS", onceKeys("schema").Done); err != nil || got != "1" {
					t.Errorf("server %d: the record: EXISTS says %q, %v", i, got, err)
				}
			}
			o := newQuorumOnce()
			servers[2].Stop()
			mustDone(t, o, true)
			if err := o.Forget(context.Background()); err != nil {
				t.Fatalf("Forget with one server of three down: %v", err)
			}
			mustDone(t, o, false) // two of three say not done: no quorum can hold the record
			if ran, err := o.Do(context.Background(), func(context.Context) error { return nil }); !ran || err != nil {
				t.Fatalf("Do after Forget, one server down: got %v, %v; want true, nil", ran, err)
			}
			mustDone(t, o, true)
		})
	}
}

// TestOnceQuorumCannotTell: with one record on one server, one server
// without it and the third down, Done cannot tell: its error matches
// ErrQuorum and names the server that failed.
func TestOnceQuorumCannotTell(t *testing.T) {
	servers := startServers(t, 3)
	backends := make([]Backend, len(servers))
	for i, s := range servers {
		backends[i] = newBackend(t, "redigo", s.Addr())
	}
	o, err := NewOnce("split", backends)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := servers[0].Do("SET", onceKeys("split").Done, "1:1:x"); err != nil {
		t.Fatal(err)
	}
	servers[2].Stop()
	done, err := o.Done(context.Background())
	if done || !errors.Is(err, ErrQuorum) || !strings.Contains(err.Error(), "node 2") {
		t.Fatalf("Done, split 1-1 with a node down: got %v, %v; want false and ErrQuorum naming node 2", done, err)
	}
}

// TestOnceObserved: an Observer sees a Once's acquire and unlock as
// KindOnce.
func TestOnceObserved(t *testing.T) {
	e := miniEnv(t)
	var mu sync.Mutex
	var kinds []Kind
	note := func(k Kind) {
		mu.Lock()
		kinds = append(kinds, k)
		mu.Unlock()
	}
	o := e.newOnce(t, "seen", WithObserver(Observer{
		Acquire: func(ctx context.Context, a AcquireStart) (context.Context, func(AcquireDone)) {
			note(a.Kind)
			return ctx, nil
		},
		Unlock: func(ctx context.Context, u UnlockDone) { note(u.Kind) },
	}))
	if _, err := o.Do(context.Background(), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kinds) != 2 || kinds[0] != KindOnce || kinds[1] != KindOnce {
		t.Errorf("the acquire's and the unlock's kinds: got %v, want [once once]", kinds)
	}
}

// TestOnceInspect: Inspect tells the run under way (the lock held), then
// the run recorded: its token, holder and how long it is remembered.
func TestOnceInspect(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		o := e.newOnce(t, "look", WithRemember(time.Hour), WithHolderInfo("job:7"))
		ctx := context.Background()
		if info, err := o.Inspect(ctx); err != nil || info.Done || info.Running.Held {
			t.Fatalf("Inspect before: got %+v, %v; want not done, not running", info, err)
		}
		before := time.Now().Add(-time.Second)
		var token uint64
		_, err := o.Do(ctx, func(ctx context.Context) error {
			info, err := o.Inspect(ctx)
			if err != nil || info.Done || !info.Running.Held || info.Running.HolderInfo != "job:7" {
				t.Errorf("Inspect while running: got %+v, %v; want running by job:7", info, err)
			}
			token = info.Running.Token
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		info, err := o.Inspect(ctx)
		if err != nil || !info.Done || info.Running.Held || info.Token != token || info.HolderInfo != "job:7" {
			t.Fatalf("Inspect after: got %+v, %v; want done by job:7 with token %d", info, err, token)
		}
		if info.TTL <= 0 || info.TTL > time.Hour {
			t.Errorf("Inspect after: TTL %v, want up to an hour", info.TTL)
		}
		if e.mini == nil && (info.At.Before(before) || info.At.After(time.Now().Add(time.Second))) {
			t.Errorf("Inspect after: recorded at %v, want about now", info.At)
		}
	})
}

// TestOnceBadInput: each bad input gives a clear error at once, naming
// what is wrong.
func TestOnceBadInput(t *testing.T) {
	e := miniEnv(t)
	b := e.backend(t)
	bs := []Backend{b}
	for _, c := range []struct {
		what string
		err  func() error
		want string
	}{
		{"an empty name", func() error { _, err := NewOnce("", bs); return err }, "empty lock name"},
		{"a name starting with '}'", func() error { _, err := NewOnce("}x", bs); return err }, "starts with '}'"},
		{"no backends", func() error { _, err := NewOnce("x", nil); return err }, "no backends"},
		{"a negative WithRemember", func() error { _, err := NewOnce("x", bs, WithRemember(-time.Second)); return err }, "WithRemember(-1s) is negative"},
		{"a WithRemember below 1ms", func() error { _, err := NewOnce("x", bs, WithRemember(time.Microsecond)); return err }, "below Redis's 1ms"},
		{"WithMinHold", func() error { _, err := NewOnce("x", bs, WithMinHold(time.Second)); return err }, "WithMinHold does not apply"},
		{"WithRemember to New", func() error { _, err := New("x", bs, WithRemember(time.Hour)); return err }, "WithRemember applies to a Once only"},
		{"WithRemember to NewRW", func() error { _, err := NewRW("x", bs, WithRemember(time.Hour)); return err }, "WithRemember applies to a Once only"},
		{"WithRemember to NewSemaphore", func() error { _, err := NewSemaphore("x", 2, bs, WithRemember(time.Hour)); return err }, "WithRemember applies to a Once only"},
		{"WithRemember to NewElection", func() error { _, err := NewElection("x", bs, WithRemember(time.Hour)); return err }, "WithRemember applies to a Once only"},
		{"WithRemember to NewMulti", func() error { _, err := NewMulti([]string{"x", "y"}, bs, WithRemember(time.Hour)); return err }, "WithRemember applies to a Once only"},
		{"WithRemember to NewClient", func() error { _, err := NewClient(bs, WithRemember(time.Hour)); return err }, "WithRemember applies to a Once only"},
		{"a nil function", func() error {
			o, err := NewOnce("x", bs)
			if err != nil {
				return err
			}
			_, err = o.Do(context.Background(), nil)
			return err
		}, "nil function"},
		{"a zero Once", func() error {
			_, err := new(Once).Do(context.Background(), func(context.Context) error { return nil })
			return err
		}, "not created by NewOnce"},
		{"a zero Once's Done", func() error { _, err := new(Once).Done(context.Background()); return err }, "not created by NewOnce"},
		{"a zero Once's Forget", func() error { return new(Once).Forget(context.Background()) }, "not created by NewOnce"},
		{"a zero Client's Once", func() error { _, err := new(Client).Once("x"); return err }, "not created by NewClient"},
		{"a zero Client's Once with options", func() error { _, err := new(Client).Once("x", WithRemember(time.Hour)); return err }, "not created by NewClient"},
	} {
		if err := c.err(); err == nil || !strings.HasPrefix(err.Error(), "netlock: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", c.what, err, c.want)
		}
	}
	c, err := NewClient(bs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Once("x", WithRemember(time.Hour)); err != nil {
		t.Errorf("Client.Once with WithRemember: %v", err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	o, _ := NewOnce("x", bs)
	if ran, err := o.Do(cancelled, func(context.Context) error { return nil }); ran || !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotObtained) {
		t.Errorf("Do with a cancelled context: got %v, %v; want false, ErrNotObtained and context.Canceled", ran, err)
	}
}

// TestOnceWaitBoundedByCtx: a Do that waits while another runs fn gives up
// when its context ends, with LockCtx's error, and fn does not run.
func TestOnceWaitBoundedByCtx(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		runner, waiter := e.newOnce(t, "slow"), e.newOnce(t, "slow")
		started, release := make(chan struct{}), make(chan struct{})
		done := async(func(ctx context.Context) error {
			_, err := runner.Do(ctx, func(context.Context) error { close(started); <-release; return nil })
			return err
		})
		<-started
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		ran, err := waiter.Do(ctx, func(context.Context) error { t.Error("fn ran while another ran it"); return nil })
		// ErrQuorum instead of ErrNotObtained if the deadline cut a call to
		// Redis short (a loaded machine), as LockCtx says.
		if ran || !(errors.Is(err, ErrNotObtained) || errors.Is(err, ErrQuorum)) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Do whose ctx ended while waiting: got %v, %v; want false, ErrNotObtained and DeadlineExceeded", ran, err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// TestOnceCluster: on a Redis Cluster, Onces of names in many slots each
// run once, their keys in one slot each.
func TestOnceCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	var runs atomic.Int32
	var wg sync.WaitGroup
	for range 3 {
		b := NewRueidis(newClusterClient(t, cluster))
		wg.Go(func() {
			for i := range 20 {
				o, err := NewOnce(fmt.Sprintf("shard:%d", i), []Backend{b})
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := o.Do(context.Background(), func(context.Context) error { runs.Add(1); return nil }); err != nil {
					t.Errorf("Do on the cluster: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if n := runs.Load(); n != 20 {
		t.Errorf("%d runs for 20 names on 3 clients, want 20", n)
	}
}
