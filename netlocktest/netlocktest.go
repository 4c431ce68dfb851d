// Package netlocktest runs netlock's locks on an in-process miniredis in
// tests, with time that moves when the test says so.
//
// New starts a miniredis server and closes it, and every client made on
// it, when the test ends. Its Redigo, Rueidis and GoRedis methods each
// return a new netlock.Backend with a client of its own, as a separate
// process would have; its waiters wait by message, in the lock's queue,
// as on Redis. FastForward moves miniredis's time and the time of the
// locks made on the server's Backends together: holders' keys expire,
// waiters take their turn at once, watchdogs extend and Lost is closed,
// without the test sleeping.
//
//	s := netlocktest.New(t)
//	holder, _ := netlock.New("job", []netlock.Backend{s.Redigo()}, netlock.WithAutoExtend(false))
//	holder.Lock() // and never unlocks: its process died
//	waiter, _ := netlock.New("job", []netlock.Backend{s.Redigo()})
//	go s.FastForward(time.Minute) // past the holder's expiry
//	waiter.Lock()                 // at once, not a minute later
//
// A lock takes the time of the first of its Backends made by a Server;
// locks whose Backends come from two Servers keep apart times, and locks on
// other Backends keep the real time. Servers of tests running in parallel
// do not share their time.
package netlocktest

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	redigo "github.com/gomodule/redigo/redis"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock"
	nlgoredis "github.com/netlock-go/netlock/goredis"
	"github.com/netlock-go/netlock/internal/clock"
)

// A Server is a miniredis server whose time, and that of the locks made on
// its Backends, moves with FastForward. Its methods are safe for concurrent
// use. Make it with New.
type Server struct {
	t     testing.TB
	mr    *miniredis.Miniredis
	clock *clock.Fake
	// now is miniredis's time (TIME, and the scripts' reading of it),
	// which stands still between FastForwards, as its keys' TTLs do.
	now time.Time
}

// New starts a miniredis server for the test t and returns it. The server,
// and every client made by its methods, are closed when the test ends (by
// t.Cleanup). It calls t.Fatal if the server cannot start.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, mr: miniredis.RunT(t), clock: clock.NewFake(), now: time.Now()}
	s.mr.SetTime(s.now)
	return s
}

// Miniredis returns the miniredis server, to look at or change its data.
// Move its time with the Server's FastForward, not its own FastForward or
// SetTime. Its clock (TIME) stands still between FastForwards, as its
// keys' TTLs do.
func (s *Server) Miniredis() *miniredis.Miniredis { return s.mr }

// Addr returns the server's address, host:port.
func (s *Server) Addr() string { return s.mr.Addr() }

// Redigo returns a new Backend on the server through a redigo pool of its
// own (netlock.NewRedigo).
func (s *Server) Redigo() netlock.Backend {
	addr := s.mr.Addr()
	pool := &redigo.Pool{
		MaxIdle: 16,
		DialContext: func(ctx context.Context) (redigo.Conn, error) {
			return redigo.DialContext(ctx, "tcp", addr)
		},
	}
	return s.attach(netlock.NewRedigo(pool), func() { pool.Close() })
}

// Rueidis returns a new Backend on the server through a rueidis client of
// its own (netlock.NewRueidis). It calls t.Fatal if the client cannot be
// made.
//
// The client has ForceSingleClient set: miniredis answers CLUSTER SLOTS,
// so rueidis would take it for a Redis Cluster, on which netlock's waiters
// wait by sharded pub/sub (SSUBSCRIBE), which miniredis does not have; its
// waiters would then poll, out of the queue. A rueidis client of your own
// on miniredis needs it too, and DisableCache (miniredis has no CLIENT
// TRACKING).
func (s *Server) Rueidis() netlock.Backend {
	s.t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{s.mr.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err != nil {
		s.t.Fatalf("netlocktest: rueidis client on %s: %v", s.mr.Addr(), err)
	}
	return s.attach(netlock.NewRueidis(c), c.Close)
}

// GoRedis returns a new Backend on the server through a go-redis client of
// its own (package netlock/goredis), with ContextTimeoutEnabled set.
func (s *Server) GoRedis() netlock.Backend {
	c := goredis.NewClient(&goredis.Options{Addr: s.mr.Addr(), ContextTimeoutEnabled: true})
	return s.attach(nlgoredis.New(c), func() { c.Close() })
}

// attach gives b the server's time until the test ends, when closeClient
// closes its client.
func (s *Server) attach(b netlock.Backend, closeClient func()) netlock.Backend {
	clock.Attach(b, s.clock)
	s.t.Cleanup(func() {
		closeClient()
		clock.Detach(b)
	})
	return b
}

// FastForward moves the time of miniredis and of the locks made on the
// server's Backends ahead by d, as if d had passed: keys whose TTL ends
// within d expire, and what the locks would have done meanwhile is done,
// in order. It moves in steps, to each time within d at which a lock is
// due to act (a watchdog's extend, a hold's deadline, a waiter's look at a
// holder's TTL): miniredis's time first, then the locks act. A watchdog's
// extend is sent before time moves on, so a hold whose process lives stays
// held however far time moves, as it would on Redis. A waiter woken by the
// move (its holder's key expired) attempts on a goroutine of its own; the
// call returns without waiting for it. An acquire or extend under way when
// FastForward is called is answered before time moves: the move is never
// part of its duration.
//
// Calls are one at a time; between them the time runs at the real pace.
// Time never moves backwards: a negative d moves nothing.
func (s *Server) FastForward(d time.Duration) {
	s.clock.Advance(d, s.step)
}

// step moves miniredis's time by d: its keys' TTLs, and its clock, which
// netlock's scripts read (TIME) for deadlines they keep in sorted sets (a
// Semaphore's leases, a NetRWMutex's readers, the waiters' places).
// FastForward alone would leave the clock where it was. Called by one
// Advance at a time.
func (s *Server) step(d time.Duration) {
	s.now = s.now.Add(d)
	s.mr.SetTime(s.now)
	s.mr.FastForward(d)
}
