package netlock

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/netlock-go/netlock/internal/clock"
)

// A hold is one acquisition of a NetMutex, from acquire to Unlock.
//
// Its watchdog is a timer, not a goroutine: a hold that is released before
// its first extend is due (most are) costs no goroutine and no context
// switch. When the timer fires, tick runs on a goroutine of its own, extends
// (with auto-extend) or declares the hold lost, and sets the timer again.
// The timer is its engine's, shared by its holds one after the other (see
// watchdog.arm).
type hold struct {
	m     *engine
	value string // our random lock value, fresh for this acquisition
	tomb  string // value's tombstone key, "" if not known (see engine.tomb)
	token uint64

	// ended is closed when the hold is lost or released (Lost); made, under
	// mu, only when asked for (see lostChan): most holds are released
	// without anyone watching.
	ended chan struct{}
	// writerWaits, for a NetRWMutex's read lease: a writer waits, so no
	// more readers of this process may share the lease (see NetRWMutex).
	writerWaits atomic.Bool

	mu      sync.Mutex
	until   time.Time // local deadline, monotonic: the hold is lost when it passes
	limit   time.Time // WithMaxHold's end of the hold; zero if none
	keep    time.Time // WithMinHold's: released before it, the key stays until then
	state   holdState
	reason  LostReason         // why it was lost, once lost
	next    time.Time          // when the next extend is due, with auto-extend
	ticking chan struct{}      // non-nil while tick runs; closed when it returns
	cancel  context.CancelFunc // cancels the extend tick runs, if any
}

type holdState int

const (
	held holdState = iota
	lost
	released
)

// newHold starts the hold's watchdog, which extends the key while auto-extend
// is on and declares the hold lost when until passes.
func newHold(m *engine, g grant) *hold {
	h := &hold{
		m:     m,
		value: g.value,
		tomb:  g.tomb,
		token: g.token,
		until: g.until,
		next:  m.nextExtend(g.start),
	}
	if m.cfg.maxHold > 0 {
		h.limit = g.start.Add(m.cfg.maxHold)
	}
	if m.cfg.minHold > 0 {
		h.keep = g.start.Add(m.cfg.minHold)
	}
	h.writerWaits.Store(g.writerWaits)
	m.dog.arm(h, h.wakeLocked()) // h is not shared yet
	return h
}

// A watchdog is the timer of an engine's holds: it ticks each hold armed
// on it when the hold's next extend is due (see hold.tick). Lock order: a
// hold's mu before the watchdog's.
type watchdog struct {
	clk   clock.Clock
	mu    sync.Mutex
	timer *time.Timer // nil until the engine's first hold
	at    time.Time   // when timer fires; zero when it is not set
	// watched are the holds the timer ticks: armed and not released.
	// Mostly one; two while a Semaphore's or a NetRWMutex's new lease
	// begins as the last one ends, whose tick may arm the old one after
	// the new.
	watched []*hold
}

// arm makes the timer run h's tick at the latest at at. The timer is the
// engine's, shared by its holds (a NetMutex has one at a time; a Semaphore's
// or NetRWMutex's new lease may begin as the last one ends, before that
// one's end, so its tick may still arm it): it ticks every hold armed and
// not released since. It is made with the engine's first hold, never stopped, and
// moved only to fire earlier: a hold that follows one released before its
// first extend was due (most are) finds it set, most often for a time no
// later than its own (its extend is due later, up to the jitter of
// nextExtend), and then costs no timer operation (each one may wake the
// runtime's network poller, on another CPU than the server's, for
// nothing). A tick that finds nothing due returns at once and arms again.
func (d *watchdog) arm(h *hold, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Contains(d.watched, h) {
		d.watched = append(d.watched, h)
	}
	switch {
	case d.timer == nil:
		d.timer = d.clk.AfterFuncAt(at, d.bark)
	case !d.at.IsZero() && !at.Before(d.at):
		return // set in time already
	default:
		d.clk.ResetAt(d.timer, at, 0)
	}
	d.at = at
}

// unwatch takes a released hold off the timer's list.
func (d *watchdog) unwatch(h *hold) {
	d.mu.Lock()
	if i := slices.Index(d.watched, h); i >= 0 {
		d.watched = slices.Delete(d.watched, i, i+1)
	}
	d.mu.Unlock()
}

// bark is the watchdog timer's function: it ticks the holds armed. Each
// tick of a hold still held arms again (a hold is on the list again only
// once its tick is over, so no hold is ticked twice at once); one armed as
// the timer fires is ticked (and arms again) or finds the timer not set
// (at zero) and sets it. Holds other than the first tick on goroutines
// of their own, so that one's extend does not hold up another's deadline.
func (d *watchdog) bark() {
	d.mu.Lock()
	hs := d.watched
	d.watched = nil
	d.at = time.Time{}
	d.mu.Unlock()
	for i, h := range hs {
		if i > 0 {
			go h.tick()
		}
	}
	if len(hs) > 0 {
		hs[0].tick()
	}
}

// nextTick returns when a watchdog whose extend began at now and returned
// err extends next: when the next extend is due (nextExtend) after one
// that succeeded; soon after one that could not ask the nodes (down, slow,
// partitioned), to try again while the hold's deadline allows.
func (m *engine) nextTick(now time.Time, err error) time.Time {
	if err != nil {
		return now.Add(max(m.cfg.expiry/extendsPerExpiry/failedExtendRetries, time.Millisecond))
	}
	return m.nextExtend(now)
}

// nextExtend returns when the extend after one made at from (or after the
// acquire begun at from) is due: at a random point of the last
// 1/extendJitter of the interval, expiry/extendsPerExpiry, never later.
// Holds taken together (ten thousand at a process's start) would otherwise
// be extended together, every interval, for as long as they are held; with
// a random part the extends of each hold drift apart from the others'.
func (m *engine) nextExtend(from time.Time) time.Time {
	interval := m.cfg.expiry / extendsPerExpiry
	return from.Add(interval - rand.N(interval/extendJitter+1))
}

// wakeLocked returns when the watchdog must next wake: the next extend
// (with auto-extend, see nextExtend) or until, whichever is first.
func (h *hold) wakeLocked() time.Time {
	wake := h.until
	if h.m.cfg.autoExtend && h.next.Before(wake) {
		wake = h.next
	}
	if !h.limit.IsZero() && h.limit.Before(wake) {
		wake = h.limit
	}
	return wake
}

// tick is the watchdog, run by the timer. Losing the hold depends on the
// local clock only: if until passes without a successful extend, the hold is
// lost then, whatever the network is doing.
func (h *hold) tick() {
	h.mu.Lock()
	if h.state != held {
		h.mu.Unlock()
		return
	}
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	h.ticking, h.cancel = done, cancel
	next := h.next
	h.mu.Unlock()
	defer func() {
		cancel()
		h.mu.Lock()
		h.ticking, h.cancel = nil, nil
		if h.state == held {
			h.m.dog.arm(h, h.wakeLocked()) // lock order: h.mu before the watchdog's
		}
		h.mu.Unlock()
		close(done)
	}()

	now := h.m.clk.Now()
	if h.expire(now) || !h.m.cfg.autoExtend || now.Before(next) {
		return // lost; or woken early, until having moved (ExtendCtx)
	}
	// While the extend runs the watchdog's timer does not tick h: a timer
	// of its own at the deadline keeps Lost() on time even if the call
	// comes back late (a frozen connection whose client library is slow to
	// honour its deadline).
	late := h.watchDeadline()
	err := h.m.extendRound(ctx, h)
	late.stop()
	if errors.Is(err, ErrLockLost) {
		h.lose()
		return
	}
	next = h.m.nextTick(now, err)
	h.mu.Lock()
	h.next = next
	h.mu.Unlock()
}

// A deadlineWatch declares its hold lost at its local deadline (or the limit
// of WithMaxHold), following the deadline as it moves (an extend of a read
// lease by a reader, see NetRWMutex, may move it while the watchdog's own
// extend is slow), until stopped.
type deadlineWatch struct {
	h       *hold
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

// watchDeadline starts a deadlineWatch of h.
func (h *hold) watchDeadline() *deadlineWatch {
	w := &deadlineWatch{h: h}
	w.mu.Lock()
	w.t = h.m.clk.AfterFuncAt(h.endsBy(), w.fire)
	w.mu.Unlock()
	return w
}

func (w *deadlineWatch) fire() {
	clk := w.h.m.clk
	if w.h.expire(clk.Now()) {
		return
	}
	at := w.h.endsBy() // until moved meanwhile: watch the new one
	w.mu.Lock()
	if !w.stopped {
		clk.ResetAt(w.t, at, 0)
	}
	w.mu.Unlock()
}

func (w *deadlineWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	w.h.m.clk.Stop(w.t)
	w.mu.Unlock()
}

// lostChan returns the channel closed when the hold is lost or released
// (see NetMutex.Lost).
func (h *hold) lostChan() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended == nil {
		if h.state != held {
			return closedChan
		}
		h.ended = make(chan struct{})
	}
	return h.ended
}

// closeEnded closes the channel of lostChan, if it was made. The caller
// holds h.mu and has just moved the hold out of held.
func (h *hold) closeEnded() {
	if h.ended != nil {
		close(h.ended)
	}
}

// endsBy returns when the hold ends unless extended: its local deadline,
// or WithMaxHold's limit if that is sooner.
func (h *hold) endsBy() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.limit.IsZero() && h.limit.Before(h.until) {
		return h.limit
	}
	return h.until
}

// deadline returns the local deadline, and false if the hold has ended.
func (h *hold) deadline() (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until, h.state == held
}

// expire declares the hold lost if until (or the limit of WithMaxHold) has
// passed at now, and reports whether the hold is over.
func (h *hold) expire(now time.Time) bool {
	h.mu.Lock()
	var reason LostReason
	if h.state == held {
		switch {
		case !now.Before(h.until):
			reason = LostDeadline
		case !h.limit.IsZero() && !now.Before(h.limit):
			reason = LostMaxHold
		}
	}
	if reason != "" {
		h.state, h.reason = lost, reason
		h.closeEnded()
	}
	over := h.state != held
	h.mu.Unlock()
	if reason != "" {
		h.m.lostHold(h, reason)
	}
	return over
}

// lostReason returns why the hold was lost; "" if it was not.
func (h *hold) lostReason() LostReason {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason
}

// lose declares the hold lost now (an extend or release found the key gone
// or taken).
func (h *hold) lose() {
	h.mu.Lock()
	lostNow := h.state == held
	if lostNow {
		h.state, h.reason = lost, LostExtend
		h.closeEnded()
	}
	h.mu.Unlock()
	if lostNow {
		h.m.lostHold(h, LostExtend)
	}
}

// moveUntil moves the local deadline to until, if the hold is still held and
// until is later. It reports whether the hold is still held.
func (h *hold) moveUntil(until time.Time) bool {
	h.mu.Lock()
	lostNow := h.state == held && !h.m.clk.Now().Before(h.until)
	if lostNow {
		h.state, h.reason = lost, LostLateExtend // the extend came back too late
		h.closeEnded()
	}
	if h.state == held && until.After(h.until) {
		h.until = until
	}
	ok := h.state == held
	h.mu.Unlock()
	if lostNow {
		h.m.lostHold(h, LostLateExtend)
	}
	return ok
}

// end waits for a tick under way (cancelling its extend), and marks the
// hold released: the watchdog's timer, m's, is left set, and its next tick
// of h returns at once. It reports whether the hold had been lost before.
func (h *hold) end() (wasLost bool) {
	h.mu.Lock()
	var reason LostReason
	if h.state == held {
		now := h.m.clk.Now()
		switch {
		case !now.Before(h.until):
			reason = LostDeadline
		case !h.limit.IsZero() && !now.Before(h.limit):
			reason = LostMaxHold
		}
		if reason != "" {
			h.state, h.reason = lost, reason
		}
		h.closeEnded()
	}
	wasLost = h.state == lost
	h.state = released
	h.m.dog.unwatch(h) // lock order: h.mu before the watchdog's
	ticking, cancel := h.ticking, h.cancel
	h.mu.Unlock()
	if reason != "" {
		h.m.lostHold(h, reason)
	}
	if ticking != nil {
		// Nothing of the hold outlives Unlock.
		cancel()
		<-ticking
	}
	return wasLost
}

// extendRound resets the key's TTL on every node, bounded by the hold's
// current local deadline (never by the deadline it would get: an extend that
// answers after until is too late). On success it moves until. It returns
// ErrLockLost when the key is gone or taken on so many nodes that a quorum
// can never hold it again.
func (m *engine) extendRound(ctx context.Context, h *hold) (err error) {
	if h.expire(m.clk.Now()) {
		return ErrLockLost // over: nothing is sent (WithMaxHold: no extend after the bound)
	}
	until, ok := h.deadline()
	if !ok {
		return ErrLockLost
	}
	ctx, cancel := m.clk.WithDeadline(ctx, until)
	defer cancel()
	measured := m.clk.Measure()
	defer measured()
	start := m.clk.Now()
	defer func() { m.extended(ctx, h, m.clk.Since(start), err) }()
	s, keys, args := m.leaseKind.extendCall(h.value)
	replies := m.fanout(ctx, s, keys, args, nil)
	if err = m.settle(replies); err != nil {
		return err
	}
	if m.opt.extended != nil {
		m.opt.extended(h, replies)
	}
	if !h.moveUntil(start.Add(m.cfg.expiry - m.clk.Since(start) - m.driftTerm)) {
		return ErrLockLost
	}
	return nil
}
