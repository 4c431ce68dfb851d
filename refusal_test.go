package netlock

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// What netlock does when Redis itself says no for a moment, on real
// servers and every client library: the refusals of a server that cannot
// persist (MISCONF) or is loading its data after a restart (LOADING).

// refusalExpiry is the expiry of the holds in these tests: far longer than
// any refusal they make, so that a release dropped on a refusal shows as a
// waiter that waits for the key to expire.
const refusalExpiry = 20 * time.Second

// queuedWaiter starts a LockCtx of name on a Backend of its own, as
// another process's, and returns it once the waiter is in the lock's queue,
// with where LockCtx's error arrives. The wait is bounded by 40 s.
func queuedWaiter(t *testing.T, client string, srv *redistest.Server, name string) (*NetMutex, <-chan error) {
	t.Helper()
	w, err := New(name, []Backend{newBackend(t, client, srv.Addr())}, WithExpiry(refusalExpiry), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		done <- w.LockCtx(ctx)
	}()
	eventually(t, 5*time.Second, "the waiter queued", func() bool {
		n, _ := srv.Do("ZCARD", w.keys.waiters)
		return n == "1"
	})
	return w, done
}

// lockedWithin fails the test unless the waiter's LockCtx returns nil
// within d, and returns how long it took.
func lockedWithin(t *testing.T, done <-chan error, d time.Duration, since time.Time) time.Duration {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiter's LockCtx: %v", err)
		}
		return time.Since(since)
	case <-time.After(d):
		t.Fatalf("the waiter did not get the lock within %v of the refusal's end (the key expires %v after its last extend)", d, refusalExpiry)
		return 0
	}
}

// A release refused because the server cannot persist (a failed BGSAVE
// with stop-writes-on-bgsave-error) is sent again until it is delivered:
// the waiter gets the lock within a moment of writes resuming.
func TestReleaseResentAfterMisconf(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			srv := redistest.Start(t, "--save", "3600 1", "--enable-protected-configs", "yes")
			dir, err := srv.Do("CONFIG", "GET", "dir")
			if err != nil {
				t.Fatal(err)
			}
			dir = strings.TrimPrefix(dir, "dir\n")
			holder, err := New("misconf", []Backend{newBackend(t, client, srv.Addr())}, WithExpiry(refusalExpiry), WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			mustLock(t, holder)
			_, done := queuedWaiter(t, client, srv, "misconf")

			// A directory nobody can write to: the save fails, and writes
			// are refused with MISCONF until one succeeds.
			failSave(t, srv, "/proc", "err")
			err = holder.UnlockCtx(context.Background())
			if err == nil || !strings.Contains(err.Error(), "MISCONF") {
				t.Fatalf("UnlockCtx while the server cannot persist: got %v, want the MISCONF error", err)
			}
			time.Sleep(300 * time.Millisecond) // refused again meanwhile
			failSave(t, srv, dir, "ok")
			resumed := time.Now()
			took := lockedWithin(t, done, 10*time.Second, resumed)
			redistest.Report(t, "MISCONF (%s): the refused release was delivered and the waiter locked %v after writes resumed (expiry %v)",
				client, took.Round(time.Millisecond), refusalExpiry)
		})
	}
}

// failSave sets the server's directory to dir, runs BGSAVE, and waits for
// the save's status to be status ("ok" or "err").
func failSave(t *testing.T, srv *redistest.Server, dir, status string) {
	t.Helper()
	if _, err := srv.Do("CONFIG", "SET", "dir", dir); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "BGSAVE started", func() bool {
		_, err := srv.Do("BGSAVE") // refused while a save runs
		return err == nil
	})
	eventually(t, 5*time.Second, "BGSAVE's status "+status, func() bool {
		info, _ := srv.Do("INFO", "persistence")
		return strings.Contains(info, "rdb_bgsave_in_progress:0") && strings.Contains(info, "rdb_last_bgsave_status:"+status)
	})
}

// A release that meets a server restarting and loading its data (the
// connection reset, then LOADING) is sent again until it is delivered:
// the waiter gets the lock within a moment of the load's end.
func TestReleaseResentAfterLoading(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			// Loading 4,000 keys takes 4 s, answering LOADING every
			// kilobyte read.
			srv := redistest.Start(t, "--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024")
			if _, err := srv.Do("EVAL", "for i = 1, 4000 do redis.call('SET', 'fill:' .. i, i) end", "0"); err != nil {
				t.Fatal(err)
			}
			holder, err := New("loading", []Backend{newBackend(t, client, srv.Addr())}, WithExpiry(refusalExpiry), WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			mustLock(t, holder)
			_, done := queuedWaiter(t, client, srv, "loading")
			if _, err := srv.Do("SAVE"); err != nil {
				t.Fatal(err)
			}

			restarted := make(chan struct{})
			go func() {
				defer close(restarted)
				srv.Restart() // returns once the server answers PING: loaded
			}()
			eventually(t, 10*time.Second, "the server loading", func() bool {
				_, err := srv.Do("PING")
				return err != nil && strings.HasPrefix(err.Error(), "LOADING")
			})
			err = holder.UnlockCtx(context.Background())
			if err == nil {
				t.Fatal("UnlockCtx while the server loads: got nil, want an error")
			}
			t.Logf("UnlockCtx while the server loads: %v", err)
			<-restarted
			loaded := time.Now()
			took := lockedWithin(t, done, 10*time.Second, loaded)
			redistest.Report(t, "LOADING (%s): the release refused while loading was delivered and the waiter locked %v after the load ended (expiry %v)",
				client, took.Round(time.Millisecond), refusalExpiry)
		})
	}
}

// A call returns by its own deadline, within a few milliseconds, whatever
// the kind of lock, whether
// Redis is frozen (it accepts and never answers: a stopped process, a
// frozen VM, a long fork) or gone (connections refused), and a wait that
// ended without an answer from Redis is reported as an outage (ErrQuorum),
// never as a lock held by another (ErrNotObtained).
func TestCallsEndByTheirDeadline(t *testing.T) {
	const late = 100 * time.Millisecond // a loaded 2-core machine's slack; the report says what it was
	for _, fault := range []string{"frozen", "gone"} {
		for _, client := range testClients() {
			t.Run(fault+"/"+client, func(t *testing.T) {
				srv := redistest.Start(t)
				m, err := New("deadline", []Backend{newBackend(t, client, srv.Addr())}, WithLogger(slog.New(slog.DiscardHandler)))
				if err != nil {
					t.Fatal(err)
				}
				mustLock(t, m) // connected, and the server checked
				mustUnlock(t, m)
				b := []Backend{newBackend(t, client, srv.Addr())}
				opts := []Option{WithLogger(slog.New(slog.DiscardHandler))}
				rw, err := NewRW("deadline-rw", b, opts...)
				if err != nil {
					t.Fatal(err)
				}
				multi, err := NewMulti([]string{"deadline-a", "deadline-b"}, b, opts...)
				if err != nil {
					t.Fatal(err)
				}
				elect, err := NewElection("deadline-elect", b, opts...)
				if err != nil {
					t.Fatal(err)
				}
				if fault == "frozen" {
					srv.Pause()
					defer srv.Resume()
				} else {
					srv.Kill()
				}
				var worst time.Duration
				for _, c := range []struct {
					name string
					d    time.Duration
					call func(ctx context.Context) error
				}{
					{"LockCtx", 300 * time.Millisecond, m.LockCtx},
					{"TryLockCtx", 300 * time.Millisecond, func(ctx context.Context) error {
						_, err := m.TryLockCtx(ctx)
						return err
					}},
					{"LockCtx", 2 * time.Second, m.LockCtx},
					{"NetRWMutex.LockCtx", 300 * time.Millisecond, rw.LockCtx},
					{"NetRWMutex.RLockCtx", 300 * time.Millisecond, rw.RLockCtx},
					{"MultiMutex.LockCtx", 300 * time.Millisecond, multi.LockCtx},
					{"Election.Campaign", 300 * time.Millisecond, func(ctx context.Context) error { return elect.Campaign(ctx, "me") }},
				} {
					ctx, cancel := context.WithTimeout(context.Background(), c.d)
					start := time.Now()
					err := c.call(ctx)
					over := time.Since(start) - c.d
					cancel()
					worst = max(worst, over)
					if over > late {
						t.Errorf("%s with a %v context returned %v after its deadline; want within %v", c.name, c.d, over.Round(time.Millisecond), late)
					}
					if !errors.Is(err, ErrQuorum) || errors.Is(err, ErrNotObtained) {
						t.Errorf("%s with a %v context: got %v; want an error matching ErrQuorum, not ErrNotObtained", c.name, c.d, err)
					}
				}
				redistest.Report(t, "Redis %s (%s): calls returned at most %v after their context's deadline", fault, client, worst.Round(time.Millisecond))
			})
		}
	}
}

// A waiter queued behind a holder, whose Redis freezes while it waits,
// returns by its context's deadline too: giving up its place in the queue
// is the reaper's business afterwards, not the caller's wait.
func TestWaitEndsByItsDeadlineWhenRedisFreezes(t *testing.T) {
	const late = 100 * time.Millisecond
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			srv := redistest.Start(t)
			holder, err := New("freeze", []Backend{newBackend(t, client, srv.Addr())}, WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			mustLock(t, holder)
			w, err := New("freeze", []Backend{newBackend(t, client, srv.Addr())}, WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			const d = 600 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			start := time.Now()
			done := async(func(context.Context) error { return w.LockCtx(ctx) })
			eventually(t, 2*time.Second, "the waiter queued", func() bool {
				n, _ := srv.Do("ZCARD", w.keys.waiters)
				return n == "1"
			})
			srv.Pause()
			err = <-done
			over := time.Since(start) - d
			srv.Resume()
			if over > late {
				t.Errorf("LockCtx with a %v context returned %v after its deadline; want within %v", d, over.Round(time.Millisecond), late)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("LockCtx: got %v, want an error matching context.DeadlineExceeded", err)
			}
			// Its place given up in the background: the holder's release
			// finds nobody to hand on to.
			eventually(t, 5*time.Second, "the waiter's queue entry gone", func() bool {
				n, _ := srv.Do("ZCARD", w.keys.waiters)
				return n == "0"
			})
			mustUnlock(t, holder)
			redistest.Report(t, "Redis frozen under a queued waiter (%s): LockCtx returned %v after its deadline", client, over.Round(time.Millisecond))
		})
	}
}
