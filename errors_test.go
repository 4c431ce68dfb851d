package netlock

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// TestOutageIsNotBusy: a wait that a short deadline ends while Redis cannot
// be asked reports the outage (ErrQuorum and the deadline), not a lock held
// elsewhere (ErrNotObtained); a wait that ends while another holds the lock
// reports ErrNotObtained and the deadline, not ErrQuorum. On one server and
// on a quorum of three with two down, on every client; the errors are one
// line.
func TestOutageIsNotBusy(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			for _, n := range []int{1, 3} {
				servers := startServers(t, n)
				name := "outage" + client
				busy := quorumMutex(t, client, servers, name)
				holder := quorumMutex(t, client, servers, name)
				mustLock(t, holder)

				err := lockFor(busy, 300*time.Millisecond)
				wantErrs(t, "held elsewhere", err, []error{ErrNotObtained, context.DeadlineExceeded}, []error{ErrQuorum})
				if err := holder.UnlockCtx(context.Background()); err != nil {
					t.Fatal(err)
				}

				// A majority down: refused connections.
				for _, s := range servers[:n/2+1] {
					s.Kill()
				}
				// As long as `netlock run --wait 2s`: go-redis's own dial
				// retries take most of a second.
				err = lockFor(busy, 2*time.Second)
				wantErrs(t, "Redis down", err, []error{ErrQuorum, context.DeadlineExceeded}, []error{ErrNotObtained})
				ok, err := busy.TryLockCtx(context.Background())
				if ok {
					t.Fatal("TryLockCtx with Redis down: got true")
				}
				wantErrs(t, "TryLockCtx, Redis down", err, []error{ErrQuorum}, []error{ErrNotObtained})
			}
		})
	}
}

// TestSemaphoreOutageIsNotFull: the same for a Semaphore's Acquire.
func TestSemaphoreOutageIsNotFull(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			srv := redistest.Start(t)
			b := newBackend(t, client, srv.Addr())
			full, err := NewSemaphore("outage", 1, []Backend{newBackend(t, client, srv.Addr())})
			if err != nil {
				t.Fatal(err)
			}
			s, err := NewSemaphore("outage", 1, []Backend{b})
			if err != nil {
				t.Fatal(err)
			}
			if err := full.Acquire(context.Background(), 1); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			err = s.Acquire(ctx, 1)
			cancel()
			wantErrs(t, "full", err, []error{ErrNotObtained, context.DeadlineExceeded}, []error{ErrQuorum})
			full.Release(1)

			srv.Kill()
			ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
			err = s.Acquire(ctx, 1)
			cancel()
			wantErrs(t, "Redis down", err, []error{ErrQuorum, context.DeadlineExceeded}, []error{ErrNotObtained})
		})
	}
}

// lockFor runs m.LockCtx with a deadline d from now.
func lockFor(m *NetMutex, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return m.LockCtx(ctx)
}

// TestFailedAcquireQuiet: an acquire that no node granted logs nothing at
// Warn, however many rounds it tried (Redis refusing connections, or
// stalled past the node timeout and then closed by its client), and the
// error it returns is the one report.
func TestFailedAcquireQuiet(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client+"/refused", func(t *testing.T) {
			srv := redistest.Start(t)
			logs := &logRecords{level: slog.LevelWarn}
			m, err := New("quiet", []Backend{newBackend(t, client, srv.Addr())}, WithLogger(slog.New(logs)), WithExpiry(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			srv.Kill()
			if err := lockFor(m, 2*time.Second); !errors.Is(err, ErrQuorum) {
				t.Fatalf("LockCtx with Redis down: got %v, want ErrQuorum", err)
			}
			waitQuiet(t, m)
			if n := logs.count(slog.LevelWarn); n != 0 {
				t.Fatalf("a failed LockCtx logged %d records at Warn, want none: %v", n, logs.recs)
			}
		})
		t.Run(client+"/stalled then closed", func(t *testing.T) {
			srv := redistest.Start(t)
			logs := &logRecords{level: slog.LevelWarn}
			b := newBackend(t, client, srv.Addr())
			m, err := New("quiet", []Backend{b}, WithLogger(slog.New(logs)), WithExpiry(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			mustLock(t, m) // the scripts loaded, the connections made
			m.Unlock()
			srv.Pause()
			if ok, err := m.TryLockCtx(context.Background()); ok || !errors.Is(err, ErrQuorum) {
				t.Fatalf("TryLockCtx with Redis stalled: got %v, %v; want false, ErrQuorum", ok, err)
			}
			srv.Kill() // as a client closed after the failed call: deliveries fail for good
			waitQuiet(t, m)
			if n := logs.count(slog.LevelWarn); n != 0 {
				t.Fatalf("a failed TryLockCtx logged %d records at Warn, want none: %v", n, logs.recs)
			}
		})
	}
}

// waitQuiet waits until m's reaper has nothing left to deliver.
func waitQuiet(t *testing.T, m *NetMutex) {
	t.Helper()
	eventually(t, 10*time.Second, "the reaper done", func() bool {
		m.reaper.mu.Lock()
		defer m.reaper.mu.Unlock()
		return !m.reaper.running
	})
}
