package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/chaos/internal/toxi"
	"github.com/netlock-go/netlock/internal/redistest"
)

// pauseSlack is how late after a hold's local deadline Lost() may be seen
// closed in TestClientPause: the watchdog and the test's watcher have to be
// scheduled.
const pauseSlack = 100 * time.Millisecond

// TestClientPause is the scenario of Kleppmann's "How to do distributed
// locking": a client holds the lock and stops (a stop-the-world GC pause,
// a suspended VM) for longer than the expiry. Another client takes the lock
// and writes to the resource; the first wakes and writes with its old token.
// The fenced resource must reject that write, and the first client must
// learn that its hold is gone: Lost() closed (at its local deadline, not
// when it wakes), ExtendCtx and UnlockCtx reporting ErrLockLost, and the
// other client's key untouched.
//
// The pause comes in two forms, on one node and on a quorum of three, with
// every client library:
//   - frozen: auto-extend on, and the holder's network stops delivering
//     (toxiproxy holds every byte back): the watchdog cannot extend, as
//     when the whole process is stopped. It is the realistic case, where
//     the holder never chose to stop extending;
//   - asleep: auto-extend off and the holder sleeps past the expiry.
//
// The holder's local deadline is computed by a recorder from its calls
// (the round's start plus its validity), not read from the library.
func TestClientPause(t *testing.T) {
	const (
		expiry = time.Second
		drift  = 0.01
	)
	for _, n := range []int{1, 3} {
		for _, client := range clients {
			for _, mode := range []string{"frozen", "asleep"} {
				t.Run(fmt.Sprintf("%d/%s/%s", n, client, mode), func(t *testing.T) {
					servers := startServers(t, n)
					x := toxi.New(t)
					var links []*toxi.Proxy
					rec := newRecorder(n, expiry, drift)
					backends := make([]netlock.Backend, n)
					for k, s := range servers {
						p := x.Proxy(s.Addr())
						links = append(links, p)
						backends[k] = rec.wrap(newBackend(t, client, p.Addr()))
					}
					opts := []netlock.Option{netlock.WithExpiry(expiry), netlock.WithDriftFactor(drift), netlock.WithNodeTimeout(200 * time.Millisecond),
						netlock.WithLogger(slog.New(slog.DiscardHandler))} // the loss is the point
					holder, err := netlock.New("kleppmann", backends, append(opts, netlock.WithAutoExtend(mode == "frozen"), netlock.WithObserver(rec.observer()))...)
					if err != nil {
						t.Fatal(err)
					}
					others := make([]netlock.Backend, n)
					for k, s := range servers {
						others[k] = newBackend(t, client, s.Addr())
					}
					other, err := netlock.New("kleppmann", others, opts...)
					if err != nil {
						t.Fatal(err)
					}
					var storage fencedResource

					mustLock(t, holder)
					old := holder.Token()
					if _, ok := rec.acquired(old); !ok {
						t.Fatalf("the holder's hold with token %d: no acquire reply the recorder saw granted it", old)
					}
					if !storage.write(0, old) {
						t.Fatalf("first write with token %d rejected", old)
					}
					lost := holder.Lost()
					lostAt := make(chan time.Time, 1)
					go func() {
						<-lost
						lostAt <- time.Now()
					}()

					// The holder stops, in the middle of its critical section.
					if mode == "frozen" {
						for _, p := range links {
							if err := p.Add("gc", toxi.Latency("upstream", 60000, 0)); err != nil {
								t.Fatal(err)
							}
						}
					}
					// Meanwhile, the other client takes the lock once the
					// holder's keys have expired, and writes.
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if err := other.LockCtx(ctx); err != nil {
						t.Fatalf("other.LockCtx while the holder is paused: %v", err)
					}
					if tok := other.Token(); tok <= old {
						t.Errorf("other's token %d, want above the paused holder's %d", tok, old)
					}
					if !storage.write(1, other.Token()) {
						t.Errorf("other's write with token %d rejected", other.Token())
					}

					// The holder wakes and goes on with its critical section.
					for _, p := range links {
						p.Remove("gc")
					}
					if storage.write(0, old) {
						t.Errorf("the woken holder's write with its old token %d was accepted after token %d", old, other.Token())
					}
					select {
					case at := <-lostAt:
						// No extend moved the deadline since the holder
						// stopped (none is due before it, nor could one
						// pass the frozen network).
						// Nor could anything else show the hold lost
						// before its deadline passed.
						until := rec.until(old)
						t.Logf("Lost() closed %v after the hold's local deadline", at.Sub(until))
						if late := at.Sub(until); late > pauseSlack {
							t.Errorf("Lost() closed %v after the hold's local deadline", late)
						}
						if early := until.Sub(at); early > pauseSlack {
							t.Errorf("Lost() closed %v before the hold's local deadline", early)
						}
					case <-time.After(5 * time.Second):
						t.Fatal("Lost() not closed 5s after another client took the lock")
					}
					if err := holder.ExtendCtx(context.Background()); !errors.Is(err, netlock.ErrLockLost) {
						t.Errorf("holder.ExtendCtx after the pause: got %v, want ErrLockLost", err)
					}
					before := keysOf(t, servers, other)
					if err := holder.UnlockCtx(context.Background()); !errors.Is(err, netlock.ErrLockLost) {
						t.Errorf("holder.UnlockCtx after the pause: got %v, want ErrLockLost", err)
					}
					if h := keysOf(t, servers, other); h != before || h < n/2+1 {
						t.Errorf("the other client's key on %d servers after the holder's unlock, %d before", h, before)
					}
					mustUnlock(t, other)
				})
			}
		}
	}
}

// keysOf counts the servers whose lock key holds m's current hold: the key
// holds "<value>:<token>:<holder>" (lua/acquire.lua), and tokens are unique.
func keysOf(t *testing.T, servers []*redistest.Server, m *netlock.NetMutex) (n int) {
	t.Helper()
	tok := m.Token()
	if tok == 0 {
		return 0
	}
	for _, s := range servers {
		if v, err := s.Do("GET", lockKey(m.Name())); err == nil && strings.Contains(v, ":"+strconv.FormatUint(tok, 10)+":") {
			n++
		}
	}
	return n
}
