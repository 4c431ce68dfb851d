package netlock

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The tests' fakes: Backends that wrap a real one to count, hold, delay or
// fail its calls, or to give it a Hub of the test's making, and Listeners
// of servers that do not answer as they should. Each keeps of the wrapped
// Backend only what it says it does (see wrapper).

// innerFinal is what b's ErrorClassifier says of err, false if b has
// none: the Final of a test's wrapper around a Backend.
func innerFinal(b Backend, err error) bool {
	f, ok := b.(ErrorClassifier)
	return ok && f.Final(err)
}

// A wrapper is a Backend over another that keeps the other's Hub, unless
// polling is set: waiters on it listen, and its calls go through that
// Hub's limiter, as on the other. It has nothing else of the other's but
// Eval: no Final (see innerFinal), no EvalWait. The fakes that change what
// a Subscriber's Eval does build on it.
type wrapper struct {
	Backend
	polling bool // no Hub: waiters poll
}

func (w wrapper) Hub() *Hub {
	if s, ok := w.Backend.(Subscriber); ok && !w.polling {
		return s.Hub()
	}
	return nil
}

// evalOnly is a Backend with nothing but Eval, the wrapped Backend's: not
// a Subscriber, an ErrorClassifier nor a ReplicaWaiter. Wrapping none, it
// is a Backend never called, for what New and its kin check without
// contacting Redis.
type evalOnly struct{ Backend }

// hubBackend is a Subscriber with the Hub a test gives it (one that says
// it is a Redis Cluster, one lacking what New needs, one that listens on
// another Hub's connections), over a Backend whose Eval it passes on; with
// none, its Eval must never run.
type hubBackend struct {
	Backend
	hub *Hub
}

func (b hubBackend) Hub() *Hub { return b.hub }

// slotsBackend is a Backend whose Hub says it is a Redis Cluster, listening
// on the connections of its Backend's own Hub; while crashed is set, every
// call is refused, as a dead process's would be.
type slotsBackend struct {
	hubBackend
	crashed *atomic.Bool
}

func (b slotsBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if b.crashed.Load() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	return b.Backend.Eval(ctx, s, keys, args)
}

// countingBackend counts the script calls made through it, by script name,
// once they have returned.
// It keeps the wrapped Backend's pub/sub hub, unless polling is set.
type countingBackend struct {
	wrapper

	mu    sync.Mutex
	calls map[string]int
}

func counting(b Backend) *countingBackend {
	return &countingBackend{wrapper: wrapper{Backend: b}, calls: make(map[string]int)}
}

// Eval counts a call once it has returned, so that a count says what
// Redis has run (a waiter counted twice has queued).
func (c *countingBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	defer func() {
		c.mu.Lock()
		c.calls[s.Name()]++
		c.mu.Unlock()
	}()
	return c.Backend.Eval(ctx, s, keys, args)
}

func (c *countingBackend) count(script string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[script]
}

// scripts returns how many script calls cb made, of any script.
func (c *countingBackend) scripts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.calls {
		n += k
	}
	return n
}

// gateBackend counts the calls made through it by script name
// (countingBackend) and, while its gate is closed, holds in flight the
// calls the gate was closed for, until it opens or, unless ignoreCtx is
// set, until their ctx ends. It counts the calls held (inFlight, peak) and
// the releases sent, held or not. It keeps the wrapped Backend's Hub, and
// so its limiter.
type gateBackend struct {
	*countingBackend
	// ignoreCtx: a held call waits for the gate even once its ctx has
	// ended, as on a client library that does not honour ctx.
	ignoreCtx bool

	mu    sync.Mutex
	gate  chan struct{}      // nil: open
	holds func(*Script) bool // the calls a closed gate holds

	inFlight atomic.Int64 // calls held, until they return
	peak     atomic.Int64 // most calls held at once
	releases atomic.Int64
}

func (b *gateBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if s == releaseScript {
		b.releases.Add(1)
	}
	b.mu.Lock()
	gate, holds := b.gate, b.holds
	b.mu.Unlock()
	if gate != nil && holds(s) {
		n := b.inFlight.Add(1)
		defer b.inFlight.Add(-1)
		for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
		}
		if b.ignoreCtx {
			<-gate
		} else {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return b.countingBackend.Eval(ctx, s, keys, args)
}

// close holds the calls that holds picks from now on; the returned func
// lets them through.
func (b *gateBackend) close(holds func(*Script) bool) (open func()) {
	gate := make(chan struct{})
	b.mu.Lock()
	b.gate, b.holds = gate, holds
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		b.gate, b.holds = nil, nil
		b.mu.Unlock()
		close(gate)
	}
}

// stuckExtends is a Backend whose extends return only after stuck, whatever
// their context says: a client library slow to honour a deadline on a
// frozen connection. With first set, only the first extend is stuck: the
// watchdog's, while a later one (ExtendCtx, or a reader's recheck of a
// read lease, see NetRWMutex.recheck) goes through.
type stuckExtends struct {
	Backend
	stuck time.Duration
	first bool
	calls atomic.Int32 // extends so far
}

func (b *stuckExtends) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if s.op == opExtend && (b.calls.Add(1) == 1 || !b.first) {
		time.Sleep(b.stuck) // a stall of that length, as a stuck link
		return nil, context.DeadlineExceeded
	}
	return b.Backend.Eval(ctx, s, keys, args)
}

// ctxSeenBackend records whether its Eval calls carried a context value.
type ctxSeenBackend struct {
	Backend
	seen, unseen atomic.Int64
}

type observerKey struct{}

func (b *ctxSeenBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if s != acquireScript {
		return b.Backend.Eval(ctx, s, keys, args)
	}
	if ctx.Value(observerKey{}) != nil {
		b.seen.Add(1)
	} else {
		b.unseen.Add(1)
	}
	return b.Backend.Eval(ctx, s, keys, args)
}

// heldBackBackend holds back, while hold is set, the calls of script: the caller
// is told the node did not answer, and the call reaches the server only when
// arrive is closed (as bytes held up on a link the client gave up on).
type heldBackBackend struct {
	wrapper
	script   string
	hold     atomic.Bool
	heldBack atomic.Int64  // the calls held back so far
	arrive   chan struct{} // closed: the held-back calls go on
	wg       sync.WaitGroup
}

// deliver stops holding calls back and lets the held-back ones reach the
// server, returning once they have.
func (b *heldBackBackend) deliver() {
	b.hold.Store(false)
	close(b.arrive)
	b.wg.Wait()
}

func (b *heldBackBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if s.Name() != b.script || !b.hold.Load() {
		return b.Backend.Eval(ctx, s, keys, args)
	}
	b.heldBack.Add(1)
	b.wg.Go(func() {
		<-b.arrive
		b.Backend.Eval(context.Background(), s, keys, args)
	})
	return nil, errors.New("i/o timeout (held back)")
}

// lateSubBackend is heldBackBackend, not polling, with the Backend's error
// classes too, so that a Semaphore on it waits by message and is granted
// by releases (see Semaphore.grants).
type lateSubBackend struct{ heldBackBackend }

func (b *lateSubBackend) Final(err error) bool { return innerFinal(b.Backend, err) }

// semFaultBackend wraps a redigo Backend on miniredis: its calls can be
// made to lose their reply, to reach Redis late, or to be slow.
type semFaultBackend struct {
	wrapper
	// fail: 1 makes the next call fail with a non-final error (its reply
	// lost) and every later one with a final error (the client closed).
	fail atomic.Int32
	// late: armed, the next sem_acquire call waits for its ctx to end,
	// reports the ctx's error, and reaches Redis only when go is closed.
	late     atomic.Bool
	entered  chan struct{}
	lateGo   chan struct{}
	lateDone chan struct{}
	// slow: sem_acquire calls of the waiter with this arrival are delayed.
	slow atomic.Int64
}

func (b *semFaultBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	switch b.fail.Load() {
	case 1:
		b.fail.Store(2)
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	case 2:
		return nil, errCrashed
	}
	if s == semAcquireScript {
		if a := b.slow.Load(); a != 0 && strings.Split(args[0], ":")[8] == strconv.FormatInt(a, 10) {
			time.Sleep(300 * time.Millisecond) // a slow attempt, on purpose
		}
		if b.late.CompareAndSwap(true, false) {
			close(b.entered)
			select {
			case <-ctx.Done():
				go func() {
					<-b.lateGo
					b.Backend.Eval(context.Background(), s, keys, args)
					close(b.lateDone)
				}()
				return nil, ctx.Err()
			case <-time.After(300 * time.Millisecond):
				close(b.lateDone) // not cut short: sent as usual
			}
		}
	}
	return b.Backend.Eval(ctx, s, keys, args)
}

func (b *semFaultBackend) Final(err error) bool {
	return errors.Is(err, errCrashed) || innerFinal(b.Backend, err)
}

// errCrashed is what every call of a crashed client gets: a final error, so
// that nothing is left to its reaper.
var errCrashed = errors.New("rwprop: client crashed")

// rwPropBackend is a client's Backend to one node of TestRWProperty: it
// moves the node's clock before each call, fails every call once its client
// crashed, and forwards Hub and Final to the redigo Backend it wraps, so
// that waiters wait by message.
type rwPropBackend struct {
	wrapper
	node *rwPropNode
	dead *atomic.Bool
}

func (b *rwPropBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if b.dead.Load() {
		return nil, errCrashed
	}
	b.node.tick()
	return b.Backend.Eval(ctx, s, keys, args)
}

func (b *rwPropBackend) Final(err error) bool {
	return errors.Is(err, errCrashed) || innerFinal(b.Backend, err)
}

// cancelBackend is a Backend that can cancel its caller's acquire midway: once
// armed, its next acquire call runs fn (a context's cancel) just before or
// just after passing the call on, while the other nodes' calls of the same
// round are in flight.
type cancelBackend struct {
	Backend
	fn    atomic.Pointer[func()]
	after bool // set with fn, read after fn is taken
}

func (b *cancelBackend) arm(fn func(), after bool) {
	b.after = after
	b.fn.Store(&fn)
}

func (b *cancelBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if s != acquireScript {
		return b.Backend.Eval(ctx, s, keys, args)
	}
	fn := b.fn.Swap(nil)
	if fn != nil && !b.after {
		(*fn)()
	}
	vals, err := b.Backend.Eval(ctx, s, keys, args)
	if fn != nil && b.after {
		(*fn)()
	}
	return vals, err
}

func (b *cancelBackend) Final(err error) bool { return innerFinal(b.Backend, err) }

// probeBackend wraps a process's Backend to see what netlock does through
// it: the acquire rounds it makes, the lock values and nonces they propose
// (to tell whose a lock key is), and the messages its pub/sub connection
// receives, of which it can drop the next one as if it were lost in flight.
// It has a hub of its own, dialing with the wrapped Backend's hub's dial.
type probeBackend struct {
	hubBackend

	rounds atomic.Int64 // acquire script calls
	msgs   atomic.Int64 // messages received and passed on to the hub
	mute   atomic.Bool  // drop the next message
	muted  atomic.Int64 // messages dropped

	mu   sync.Mutex
	mine map[string]bool // lock values and nonces proposed by acquire rounds
}

func newProbe(b Backend) *probeBackend {
	p := &probeBackend{hubBackend: hubBackend{Backend: b}, mine: map[string]bool{}}
	inner := b.(Subscriber).Hub()
	p.hub = NewHub(HubConfig{Listen: func(ctx context.Context, onMessage func(channel, payload string)) (Listener, error) {
		return inner.listen(ctx, func(channel, payload string) {
			if p.mute.CompareAndSwap(true, false) {
				p.muted.Add(1)
				return
			}
			p.msgs.Add(1)
			onMessage(channel, payload)
		})
	}, Cluster: !inner.counted})
	return p
}

func (p *probeBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if s == acquireScript && len(args) > 2 {
		p.rounds.Add(1)
		p.mu.Lock()
		p.mine[args[0]] = true
		// ARGV[3] is "<proposal>:<member>:<flags>", a member
		// "<waiter id>+<expiry ms>+<nonce>" when a release may grant the
		// lock, as "<nonce>.<n>" (see lua/acquire.lua).
		if _, member, ok := strings.Cut(args[2], ":"); ok {
			member, _, _ = strings.Cut(member, ":")
			if parts := strings.Split(member, "+"); len(parts) == 3 && parts[2] != "" {
				p.mine[parts[2]] = true
			}
		}
		p.mu.Unlock()
	}
	return p.Backend.Eval(ctx, s, keys, args)
}

func (p *probeBackend) Final(err error) bool { return innerFinal(p.Backend, err) }

// owns reports whether the lock value v (the key's "<value>:<token>:<holder>"
// without the token and holder) was proposed through p, or granted to one of its nonces.
func (p *probeBackend) owns(v string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	nonce, _, _ := strings.Cut(v, ".")
	return p.mine[v] || p.mine[nonce]
}

// stuckListener is a Listener whose SUBSCRIBE of channel stuck blocks until
// its context ends (a server that does not answer), and whose other
// SUBSCRIBEs are confirmed at once.
type stuckListener struct {
	stuck     string
	confirmed chan string
	closeOnce sync.Once
	closed    chan struct{}
}

func newStuckListener(stuck string) *stuckListener {
	return &stuckListener{stuck: stuck, confirmed: make(chan string, 16), closed: make(chan struct{})}
}

func (l *stuckListener) Subscribe(ctx context.Context, channel string) error {
	if channel == l.stuck {
		<-ctx.Done()
		return ctx.Err()
	}
	l.confirmed <- channel
	return nil
}

func (l *stuckListener) Unsubscribe(context.Context, string) error { return nil }

func (l *stuckListener) Confirmed() (string, error) {
	select {
	case ch := <-l.confirmed:
		return ch, nil
	case <-l.closed:
		return "", errors.New("closed")
	}
}

func (l *stuckListener) Close() { l.closeOnce.Do(func() { close(l.closed) }) }

// shardListener is a Listener of a fake shard: the server confirms each
// SSUBSCRIBE at once, and fail makes Confirmed return an error, as a lost
// connection, a MOVED reply or a server's own sunsubscribe do.
type shardListener struct {
	node      string
	onMessage func(channel, payload string)
	confirms  chan string
	failed    chan struct{}
	once      sync.Once
}

func (l *shardListener) Subscribe(_ context.Context, channel string) error {
	l.confirms <- channel
	return nil
}

func (l *shardListener) Unsubscribe(context.Context, string) error { return nil }

func (l *shardListener) Confirmed() (string, error) {
	select {
	case ch := <-l.confirms:
		return ch, nil
	case <-l.failed:
		return "", errors.New("shard " + l.node + " failed")
	}
}

func (l *shardListener) Close() { l.fail() }

func (l *shardListener) fail() { l.once.Do(func() { close(l.failed) }) }
