// Package clock is the time netlock's engine reasons by: the local deadline
// of a hold, its watchdog, Lost, and a waiter's sleep by the holder's TTL.
//
// The zero Clock is the real one: each method is the package time function
// of the same name behind one nil test, and times carry the monotonic
// reading. A Fake, which package netlocktest attaches to the Backends it
// makes (see Attach), runs at the real clock's pace ahead of it by an offset
// that Advance moves, firing the timers that fall due on the way. It is
// internal: importable by netlock and netlocktest, by nothing of a user's.
//
// What is not the engine's reasoning stays on the real clock everywhere:
// the per-node timeout of a call (a socket deadline the client library
// reads from the context, against the real clock), a connection's idle
// time, the pub/sub hub's linger, and the pauses between retries of a
// call that failed (the reaper's, a Semaphore's count fix). A Fake that
// moved them would cut short calls that the server answers at once, or
// retry a node as often as a test moves time. Only the give-up times of
// those retries, counted in expiries, are the engine's.
//
// Engine code takes its Clock from its NetMutex (m.clk); a time.Now,
// time.AfterFunc or timer Reset of its own would keep the real clock under
// a test that moves time.
package clock

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

// A Clock tells the time and makes timers. The zero Clock is the real one.
type Clock struct{ f *Fake }

// Now returns the current time.
func (c Clock) Now() time.Time {
	if c.f == nil {
		return time.Now()
	}
	return c.f.Now()
}

// Since returns the time elapsed since t.
func (c Clock) Since(t time.Time) time.Duration {
	if c.f == nil {
		return time.Since(t)
	}
	return c.f.Now().Sub(t)
}

// Until returns the duration until t.
func (c Clock) Until(t time.Time) time.Duration {
	if c.f == nil {
		return time.Until(t)
	}
	return t.Sub(c.f.Now())
}

// Timers are set for a time of the clock, not a duration: a Fake computes
// the duration from its own now, at once, so that an Advance cannot come
// between the two and leave the timer late by its whole length.

// NewTimerAt is time.NewTimer for a wait that ends at at, or as late as
// leeway after: the real clock fires it at at+leeway, a Fake at at. A
// waiter's jitter is such a leeway: on the real clock it spreads the
// waiters' attempts, and a test that moves time past a holder's expiry
// sees the waiter attempt then, without knowing of the jitter. Its Reset
// and Stop must go through c.
func (c Clock) NewTimerAt(at time.Time, leeway time.Duration) *time.Timer {
	if c.f == nil {
		return time.NewTimer(time.Until(at) + leeway)
	}
	return c.f.newTimer(at, nil)
}

// AfterFuncAt is time.AfterFunc, calling f at at. Its Reset and Stop must
// go through c.
func (c Clock) AfterFuncAt(at time.Time, f func()) *time.Timer {
	if c.f == nil {
		return time.AfterFunc(time.Until(at), f)
	}
	return c.f.newTimer(at, f)
}

// ResetAt sets t, made by c, to fire at at, or as late as leeway after (see
// NewTimerAt), as t.Reset does.
func (c Clock) ResetAt(t *time.Timer, at time.Time, leeway time.Duration) bool {
	if c.f == nil {
		return t.Reset(time.Until(at) + leeway)
	}
	return c.f.reset(t, at)
}

// Measure marks the start of a call whose duration the engine measures (an
// acquire's, an extend's), and returns the function that marks its end. A
// Fake does not move while such calls are under way: their duration holds
// no Advance, as a test means it to hold none (a grant sent before the
// move and answered after it would be a hold that took all the move to
// come back, lost at once).
func (c Clock) Measure() (end func()) {
	if c.f == nil {
		return nothing
	}
	return c.f.measure()
}

func nothing() {}

// Stop is t.Stop(), for a timer made by c.
func (c Clock) Stop(t *time.Timer) bool {
	if c.f == nil {
		return t.Stop()
	}
	return c.f.stop(t)
}

// WithDeadline is context.WithDeadline with a deadline of c's: a Fake's
// becomes the real deadline as far ahead as it is of the Fake's now (a
// context's deadline is read against the real clock).
func (c Clock) WithDeadline(ctx context.Context, t time.Time) (context.Context, context.CancelFunc) {
	if c.f == nil {
		return context.WithDeadline(ctx, t)
	}
	return context.WithTimeout(ctx, c.Until(t))
}

// A Fake is a clock ahead of the real one by an offset that only Advance
// moves: between Advances it runs at the real pace, so timers of a few
// milliseconds (retry delays) fire as they would, and what waits for an
// expiry waits for an Advance.
//
// Its timers are real timers, set for the real time at which the Fake
// reaches their due time; the Fake records that due time, so that Advance
// can fire them early. A timer's Reset and Stop must go through the Clock
// that made it.
type Fake struct {
	advancing sync.Mutex // one Advance at a time

	mu     sync.Mutex
	offset time.Duration
	timers map[*time.Timer]*timer
	calls  int           // measured calls under way (see Measure)
	idle   chan struct{} // closed when calls drops to 0; nil while it is 0
}

// A timer is what a Fake knows of one of its timers.
type timer struct {
	f     func()    // AfterFunc's; nil for a channel timer
	when  time.Time // its due time
	armed bool
}

// NewFake returns a Fake that reads the real time now.
func NewFake() *Fake {
	return &Fake{timers: make(map[*time.Timer]*timer)}
}

// Clock returns the Clock that reads f.
func (f *Fake) Clock() Clock { return Clock{f} }

// Now returns f's time: the real time (with its monotonic reading) plus
// the offset.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Add(f.offset)
}

func (f *Fake) newTimer(at time.Time, fn func()) *time.Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := at.Sub(time.Now().Add(f.offset))
	tm := &timer{f: fn, when: at, armed: true}
	var t *time.Timer
	if fn == nil {
		t = time.NewTimer(d)
	} else {
		t = time.AfterFunc(d, func() {
			f.fired(tm)
			fn()
		})
	}
	f.timers[t] = tm
	return t
}

// fired marks an AfterFunc timer that fired by the real clock, unless it
// was set again meanwhile, for later.
func (f *Fake) fired(tm *timer) {
	f.mu.Lock()
	if !tm.when.After(time.Now().Add(f.offset)) {
		tm.armed = false
	}
	f.mu.Unlock()
}

func (f *Fake) reset(t *time.Timer, at time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	tm := f.timers[t]
	if tm == nil {
		// A channel timer whose value was delivered; or one of
		// AfterFunc stopped, whose function Advance then leaves to the
		// timer (Reset(0)) rather than running it itself.
		tm = &timer{}
		f.timers[t] = tm
	}
	tm.when, tm.armed = at, true
	return t.Reset(at.Sub(time.Now().Add(f.offset)))
}

func (f *Fake) stop(t *time.Timer) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Forgotten: the engine never sets an AfterFunc timer again once it
	// stopped it, and a channel timer's Reset records it anew.
	delete(f.timers, t)
	return t.Stop()
}

// maxStill bounds the rounds in a row of one Advance that find timers due
// without moving time: timers whose functions keep setting timers due at
// once would otherwise keep it going for ever.
const maxStill = 1000

// Advance moves f ahead by d, in steps: to each due time of a timer within
// d in turn, calling step with the step's length (package netlocktest moves
// miniredis's time there, so that keys expire before the timers due with
// them fire), then firing the timers due. An AfterFunc timer's function
// runs on the calling goroutine, and returns before the next step: a
// watchdog's extend is sent before time moves on. A channel timer fires as
// by the real clock. Advances are one at a time.
func (f *Fake) Advance(d time.Duration, step func(time.Duration)) {
	f.advancing.Lock()
	defer f.advancing.Unlock()
	left := max(d, 0)
	for still := 0; still < maxStill; {
		jump := f.jump(left)
		left -= jump
		if jump > 0 {
			still = 0
			if step != nil {
				step(jump)
			}
		} else {
			still++
		}
		due := f.due()
		for _, fn := range due {
			fn()
		}
		if left == 0 && len(due) == 0 {
			return
		}
	}
	// Timers keep falling due at once: the rest of d without them.
	f.mu.Lock()
	f.offset += left
	f.mu.Unlock()
	if step != nil && left > 0 {
		step(left)
	}
}

// measure counts a measured call until the function it returns is called.
func (f *Fake) measure() func() {
	f.mu.Lock()
	if f.calls == 0 {
		f.idle = make(chan struct{})
	}
	f.calls++
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			if f.calls--; f.calls == 0 {
				close(f.idle)
				f.idle = nil
			}
			f.mu.Unlock()
		})
	}
}

// maxMeasured bounds, in real time, how long an Advance waits for the
// measured calls under way to end: a call that hangs (a Backend of a
// test's own) must not hang the test's Advance with it.
const maxMeasured = 10 * time.Second

// jump moves the offset to the earliest due time of a timer within left,
// or by left if there is none, once no measured call is under way, and
// returns how far it moved.
func (f *Fake) jump(left time.Duration) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var bound *time.Timer
wait:
	for f.calls > 0 {
		if bound == nil {
			bound = time.NewTimer(maxMeasured)
			defer bound.Stop()
		}
		idle := f.idle
		f.mu.Unlock()
		select {
		case <-idle:
			f.mu.Lock()
		case <-bound.C:
			f.mu.Lock()
			break wait // moves under a call that hangs
		}
	}
	now := time.Now().Add(f.offset)
	jump := left
	for _, tm := range f.timers {
		if tm.armed {
			jump = min(jump, max(tm.when.Sub(now), 0))
		}
	}
	f.offset += jump
	return jump
}

// due returns the functions to run of the AfterFunc timers due now, having
// made the channel timers due now fire. A timer the real clock fired
// already is left alone.
func (f *Fake) due() []func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now().Add(f.offset)
	var fns []func()
	for t, tm := range f.timers {
		if !tm.armed || tm.when.After(now) {
			continue
		}
		tm.armed = false
		if !t.Stop() {
			// Fired by the real clock: its value, or its function, is
			// under way.
			if tm.f == nil {
				delete(f.timers, t)
			}
			continue
		}
		if tm.f == nil {
			// Stop has taken back a value not received yet (Go 1.23
			// timers), or none was sent: fire it now.
			t.Reset(0)
			delete(f.timers, t)
			continue
		}
		fns = append(fns, tm.f)
	}
	return fns
}

// Backends carry their Fake in a registry rather than through a method: the
// Backends package netlocktest makes are netlock's own (NewRedigo,
// NewRueidis, goredis.New), unwrapped, so a test runs the code a program
// runs, and none of their methods says anything about clocks. A program
// that never attaches one skips the map (attachedN is 0).
var (
	attached  sync.Map // Backend (a comparable value) → *Fake
	attachedN atomic.Int64
)

// Attach makes f the clock of the locks made on b, a comparable value (a
// pointer), until Detach(b).
func Attach(b any, f *Fake) {
	if _, loaded := attached.Swap(b, f); !loaded {
		attachedN.Add(1)
	}
}

// Detach undoes Attach(b, ...).
func Detach(b any) {
	if _, loaded := attached.LoadAndDelete(b); loaded {
		attachedN.Add(-1)
	}
}

// Of returns the Clock of the locks made on backends: the Fake attached to
// the first of them that has one, or the real clock. A value of a type
// that is not comparable has none.
func Of[B any](backends []B) Clock {
	if attachedN.Load() == 0 {
		return Clock{}
	}
	for _, b := range backends {
		if t := reflect.TypeOf(b); t == nil || !t.Comparable() {
			continue
		}
		if f, ok := attached.Load(any(b)); ok {
			return Clock{f.(*Fake)}
		}
	}
	return Clock{}
}
