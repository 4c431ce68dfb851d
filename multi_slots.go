package netlock

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
)

// slotGroups is a MultiMutex over names in several hash slots of a Redis
// Cluster, where one script cannot touch them all. Its names are grouped by
// slot; each group is a NetMutex running a multiKind over the slot's names,
// so one script takes, extends or releases a group. The set is taken by
// this protocol (see docs/multi.md):
//
//   - The groups are tried in one global order, by slot (and within a
//     group the script takes the names in sorted order), the same for every
//     caller whatever the order it gave the names in.
//   - A caller waits for a group (by message, in the group's waiters'
//     queue, as a NetMutex waits) only while it holds no other group; every
//     other group it takes with one attempt. A group found held, or whose
//     node does not answer, makes it release every group it took and wait
//     for that one; once it has it, it tries the others again.
//
// Never holding while waiting is what makes it deadlock-free whatever the
// order of the names, and what keeps it from keeping out the holders of a
// group it does not use: a caller waiting for a busy group holds the other
// groups for no longer than one attempt each. The global order makes
// callers that contend for the same groups try them in the same order, so
// that the first to take a group gets them all, and the others wait for it.
//
// The groups' holds are not extended by watchdogs of their own (their
// engines run with auto-extend off): one watchdog, the set's, extends every
// group together, and the set is lost when any group's hold is.
type slotGroups struct {
	groups     []*engine // per slot, in the order of the slots
	of         []int     // per name as given to NewMulti, its group
	autoExtend bool

	mu  sync.Mutex
	set *setHold // the hold of every group; nil when not locked
}

// newSlotGroups returns the slotGroups of names (as given to NewMulti),
// grouped by slot in bySlot, on backends with opts; autoExtend is the
// resolved option's value.
func newSlotGroups(names []string, bySlot [][]string, backends []Backend, opts []Option, autoExtend bool) (*slotGroups, error) {
	s := &slotGroups{of: make([]int, len(names)), autoExtend: autoExtend}
	group := map[string]int{}
	// The set's watchdog extends the groups: theirs are off.
	groupOpts := append(slices.Clip(opts), WithAutoExtend(false))
	for i, ns := range bySlot {
		m, err := newMultiEngine(ns, strings.Join(ns, ","), backends, groupOpts)
		if err != nil {
			return nil, err
		}
		s.groups = append(s.groups, m)
		for _, n := range ns {
			group[n] = i
		}
	}
	for i, n := range names {
		s.of[i] = group[n]
	}
	return s, nil
}

// LockCtx takes every group. It waits for the first group, then tries the
// others in order; a group that it could not take becomes the next it
// waits for, once it has released those it took (see slotGroups).
func (s *slotGroups) lockCtx(ctx context.Context) error {
	for first := 0; ; {
		if err := s.groups[first].lockCtx(ctx); err != nil {
			return err // holding no other group
		}
		next, err := s.takeRest(ctx, first)
		if err != nil {
			return err
		}
		if next < 0 {
			break
		}
		first = next
	}
	if ctx.Err() != nil {
		// ctx ended as the last group came: a caller whose ctx has ended
		// when LockCtx returns holds nothing.
		s.release(ctx, s.all())
		return notObtained(context.Cause(ctx))
	}
	s.begin()
	return nil
}

// takeRest tries, once each and in order, the groups other than first,
// which it holds. It returns -1 when it holds them all. Otherwise it has
// released every group it held, and returns the group it could not take
// (held elsewhere, or its nodes not answering: waiting for it rides the
// outage out, as LockCtx does), or the error of ctx's end.
func (s *slotGroups) takeRest(ctx context.Context, first int) (int, error) {
	taken := []int{first}
	for j, g := range s.groups {
		if j == first {
			continue
		}
		ok, err := g.tryLockCtx(ctx)
		if ok {
			taken = append(taken, j)
			continue
		}
		s.release(ctx, taken)
		if cause := ctxEnded(ctx); cause != nil {
			if err == nil {
				err = notObtained(cause)
			}
			return 0, err
		}
		return j, nil
	}
	return -1, nil
}

// TryLockCtx tries every group once, in order, and releases those it took
// if one is held elsewhere or cannot be asked.
func (s *slotGroups) tryLockCtx(ctx context.Context) (bool, error) {
	taken := make([]int, 0, len(s.groups))
	for j, g := range s.groups {
		ok, err := g.tryLockCtx(ctx)
		if !ok {
			s.release(ctx, taken)
			return false, err
		}
		taken = append(taken, j)
	}
	s.begin()
	return true, nil
}

// release unlocks the groups taken, on every node, under a context that
// ctx's cancellation does not reach (the caller may have given up; the
// keys must go anyway). A release a node does not take is the groups'
// reapers' to deliver.
func (s *slotGroups) release(ctx context.Context, taken []int) {
	s.each(context.WithoutCancel(ctx), taken, (*engine).unlockCtx)
}

func (s *slotGroups) all() []int {
	all := make([]int, len(s.groups))
	for i := range all {
		all[i] = i
	}
	return all
}

// each runs fn on the groups of idx together, each on a goroutine of its
// own but the last, and returns their errors joined.
func (s *slotGroups) each(ctx context.Context, idx []int, fn func(*engine, context.Context) error) error {
	errs := make([]error, len(idx))
	var wg sync.WaitGroup
	for i, j := range idx {
		if i == len(idx)-1 {
			errs[i] = fn(s.groups[j], ctx)
			break
		}
		wg.Go(func() { errs[i] = fn(s.groups[j], ctx) })
	}
	wg.Wait()
	return join(errs...)
}

// UnlockCtx stops the set's watchdog and releases every group. It returns
// ErrNotHeld when the set is not held, ErrLockLost if a group's hold had
// been lost, and the groups' other errors joined.
func (s *slotGroups) unlockCtx(ctx context.Context) error {
	s.mu.Lock()
	sh := s.set
	s.set = nil
	s.mu.Unlock()
	if sh == nil {
		return ErrNotHeld
	}
	sh.stop()
	err := s.each(ctx, s.all(), (*engine).unlockCtx)
	sh.joinLost() // every group's hold has ended
	if errors.Is(err, ErrLockLost) {
		return ErrLockLost
	}
	return err
}

// ExtendCtx extends every group together: ErrLockLost if any group's hold
// is lost (the others' may have been extended), ErrNotHeld if the set is
// not held.
func (s *slotGroups) extendCtx(ctx context.Context) error {
	s.mu.Lock()
	sh := s.set
	s.mu.Unlock()
	if sh == nil {
		return ErrNotHeld
	}
	return sh.extend(ctx)
}

// extend extends every group together; when one is lost, it closes Lost
// before it returns ErrLockLost.
func (sh *setHold) extend(ctx context.Context) error {
	err := sh.s.each(ctx, sh.s.all(), (*engine).extendCtx)
	if errors.Is(err, ErrLockLost) {
		sh.closeLost()
		return ErrLockLost
	}
	return err
}

// Lost returns the set's Lost channel (see setHold.lostChan).
func (s *slotGroups) lostChan() <-chan struct{} {
	s.mu.Lock()
	sh := s.set
	s.mu.Unlock()
	if sh == nil {
		return closedChan
	}
	return sh.lostChan()
}

func (s *slotGroups) tokens() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set == nil {
		return nil
	}
	return slices.Clone(s.set.tokens)
}

// A setHold is one hold of every group of a slotGroups: its watchdog and
// its Lost channel.
type setHold struct {
	s      *slotGroups
	holds  []*hold  // per group
	tokens []uint64 // per name as given to NewMulti, its group's token

	mu         sync.Mutex
	lost       chan struct{} // made by lostChan; closed when a group's hold ends
	lostClosed bool
	watched    chan struct{}      // closed when the goroutine of lostChan returns
	dog        *time.Timer        // the watchdog; nil with auto-extend off
	stopped    bool               // by Unlock: the watchdog does not tick again
	ticking    chan struct{}      // non-nil while tick runs; closed when it returns
	cancel     context.CancelFunc // cancels the extend tick runs
}

// begin makes the groups' holds the set's hold, and starts its watchdog.
// The caller owns every group.
func (s *slotGroups) begin() {
	sh := &setHold{s: s, holds: make([]*hold, len(s.groups)), tokens: make([]uint64, len(s.of))}
	var first time.Time // the earliest extend due
	for i, g := range s.groups {
		h := g.current()
		sh.holds[i] = h
		h.mu.Lock()
		if first.IsZero() || h.next.Before(first) {
			first = h.next
		}
		h.mu.Unlock()
	}
	for i, g := range s.of {
		sh.tokens[i] = sh.holds[g].token
	}
	if s.autoExtend {
		sh.mu.Lock()
		sh.dog = s.groups[0].clk.AfterFuncAt(first, sh.tick)
		sh.mu.Unlock()
	}
	s.mu.Lock()
	s.set = sh
	s.mu.Unlock()
}

// tick is the set's watchdog: it extends every group together, and arms
// itself again unless a group's hold is lost (then the others are left to
// expire, or to Unlock) or Unlock stopped it. Each group's hold is lost by
// its own local deadline, whatever the extend is doing.
func (sh *setHold) tick() {
	sh.mu.Lock()
	if sh.stopped {
		sh.mu.Unlock()
		return
	}
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	sh.ticking, sh.cancel = done, cancel
	sh.mu.Unlock()

	m := sh.s.groups[0]
	now := m.clk.Now()
	err := sh.extend(ctx)
	next := m.nextTick(now, err)
	cancel()
	sh.mu.Lock()
	if !sh.stopped && !errors.Is(err, ErrLockLost) && !errors.Is(err, ErrNotHeld) {
		m.clk.ResetAt(sh.dog, next, 0)
	}
	sh.ticking, sh.cancel = nil, nil
	sh.mu.Unlock()
	close(done)
}

// stop stops the watchdog, waiting for (and cancelling the extend of) a
// tick under way: nothing of the set's hold outlives Unlock.
func (sh *setHold) stop() {
	sh.mu.Lock()
	sh.stopped = true
	if sh.dog != nil {
		sh.s.groups[0].clk.Stop(sh.dog)
	}
	ticking, cancel := sh.ticking, sh.cancel
	sh.mu.Unlock()
	if ticking != nil {
		cancel()
		<-ticking
	}
}

// lostChan returns a channel closed when any group's hold ends: lost, or
// released by Unlock. It is closed at once if one has ended already; else
// a goroutine, started by the first call, waits for the first of the
// groups' Lost channels (an extend that finds a group lost closes it
// itself, before it returns). The goroutine returns by Unlock at the
// latest, which waits for it.
func (sh *setHold) lostChan() <-chan struct{} {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.lost != nil {
		return sh.lost
	}
	sh.lost = make(chan struct{})
	cases := make([]reflect.SelectCase, len(sh.holds))
	for i, h := range sh.holds {
		c := h.lostChan()
		select {
		case <-c:
			close(sh.lost)
			sh.lostClosed = true
			return sh.lost
		default:
		}
		cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)}
	}
	watched := make(chan struct{})
	sh.watched = watched
	go func() {
		defer close(watched)
		reflect.Select(cases)
		sh.closeLost()
	}()
	return sh.lost
}

// closeLost closes the channel of lostChan, if it was made and is open.
func (sh *setHold) closeLost() {
	sh.mu.Lock()
	if sh.lost != nil && !sh.lostClosed {
		close(sh.lost)
		sh.lostClosed = true
	}
	sh.mu.Unlock()
}

// joinLost waits for the goroutine of lostChan, if there is one, once every
// group's hold has ended.
func (sh *setHold) joinLost() {
	sh.mu.Lock()
	watched := sh.watched
	sh.mu.Unlock()
	if watched != nil {
		<-watched
	}
}
