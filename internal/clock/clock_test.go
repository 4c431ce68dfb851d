package clock

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// fired reports whether c has a value now.
func fired(c <-chan time.Time) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// receive waits for a value of c, up to a second of real time.
func receive(t *testing.T, c <-chan time.Time) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(time.Second):
		t.Fatal("timer did not fire")
	}
}

func TestRealClockIsTime(t *testing.T) {
	var c Clock
	now := c.Now()
	if now.Round(0) == now {
		t.Error("real clock's Now has no monotonic reading")
	}
	tm := c.NewTimerAt(c.Now(), time.Millisecond)
	receive(t, tm.C)
	if c.Stop(tm) {
		t.Error("Stop of a fired timer: got true, want false")
	}
	done := make(chan struct{})
	c.AfterFuncAt(c.Now().Add(time.Millisecond), func() { close(done) })
	<-done
}

func TestAdvanceStepsThroughTimers(t *testing.T) {
	f := NewFake()
	c := f.Clock()
	start := c.Now()
	var at []time.Duration // when each function ran, from start
	var steps []time.Duration
	var again *time.Timer
	again = c.AfterFuncAt(start.Add(10*time.Second), func() {
		at = append(at, c.Since(start).Round(time.Second))
		if len(at) < 3 {
			c.ResetAt(again, c.Now().Add(10*time.Second), 0) // set again from its function, as a watchdog does
		}
	})
	f.Advance(35*time.Second, func(d time.Duration) { steps = append(steps, d.Round(time.Second)) })
	if want := []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second}; !slices.Equal(at, want) {
		t.Errorf("functions ran at %v, want %v", at, want)
	}
	if want := []time.Duration{10 * time.Second, 10 * time.Second, 10 * time.Second, 5 * time.Second}; !slices.Equal(steps, want) {
		t.Errorf("steps: got %v, want %v", steps, want)
	}
	if got := c.Since(start).Round(time.Second); got != 35*time.Second {
		t.Errorf("after Advance(35s): got %v, want 35s", got)
	}
}

func TestAdvanceFiresChannelTimerOnce(t *testing.T) {
	f := NewFake()
	c := f.Clock()
	tm := c.NewTimerAt(c.Now().Add(time.Minute), 0)
	f.Advance(59*time.Second, nil)
	if fired(tm.C) {
		t.Fatal("fired before its due time")
	}
	f.Advance(time.Second, nil)
	receive(t, tm.C)
	f.Advance(time.Hour, nil)
	if fired(tm.C) {
		t.Error("fired again by a later Advance")
	}
	c.ResetAt(tm, c.Now().Add(time.Minute), 0)
	f.Advance(time.Minute, nil)
	receive(t, tm.C)
}

func TestAdvanceLeavesStoppedTimers(t *testing.T) {
	f := NewFake()
	c := f.Clock()
	tm := c.NewTimerAt(c.Now().Add(time.Minute), 0)
	ran := false
	fn := c.AfterFuncAt(c.Now().Add(time.Minute), func() { ran = true })
	if !c.Stop(tm) || !c.Stop(fn) {
		t.Fatal("Stop of a set timer: got false, want true")
	}
	f.Advance(time.Hour, nil)
	if fired(tm.C) || ran {
		t.Errorf("a stopped timer fired (channel %v, function %v)", fired(tm.C), ran)
	}
}

// A Fake fires a timer at its time, not its leeway later.
func TestFakeCutsLeeway(t *testing.T) {
	f := NewFake()
	c := f.Clock()
	tm := c.NewTimerAt(c.Now().Add(50*time.Second), 10*time.Second)
	f.Advance(50*time.Second, nil)
	receive(t, tm.C)
	c.ResetAt(tm, c.Now().Add(50*time.Second), 10*time.Second)
	f.Advance(49*time.Second, nil)
	if fired(tm.C) {
		t.Error("fired before its time")
	}
}

// A timer set for a time of the clock is due then, though the clock moved
// after that time was read: an Advance between the two does not make it
// late.
func TestTimerAtAfterAdvance(t *testing.T) {
	f := NewFake()
	c := f.Clock()
	at := c.Now().Add(time.Minute)
	f.Advance(2*time.Minute, nil)
	receive(t, c.NewTimerAt(at, 0).C)
}

func TestFakeRunsAtRealPace(t *testing.T) {
	c := NewFake().Clock()
	tm := c.NewTimerAt(c.Now().Add(time.Millisecond), 0)
	receive(t, tm.C) // without an Advance
}

func TestFakeWithDeadline(t *testing.T) {
	f := NewFake()
	c := f.Clock()
	f.Advance(time.Hour, nil)
	ctx, cancel := c.WithDeadline(context.Background(), c.Now().Add(time.Minute))
	defer cancel()
	dl, _ := ctx.Deadline()
	if left := time.Until(dl); left < 50*time.Second || left > time.Minute {
		t.Errorf("real time left: got %v, want about a minute", left)
	}
}

func TestOf(t *testing.T) {
	type backend struct{ int }
	a, b := &backend{1}, &backend{2}
	if Of([]any{a, b}).f != nil {
		t.Fatal("a clock before Attach")
	}
	f := NewFake()
	Attach(b, f)
	if got := Of([]any{a, b, []int{1}}).f; got != f {
		t.Errorf("Of after Attach: got %p, want %p", got, f)
	}
	Detach(b)
	if Of([]any{a, b}).f != nil {
		t.Error("a clock after Detach")
	}
}

// A timer whose function sets it due at once again, for ever, does not keep
// Advance from returning, or from moving time by all of d.
func TestAdvanceEndsWithTimersDueAtOnce(t *testing.T) {
	f := NewFake()
	c := f.Clock()
	start := c.Now()
	var tm *time.Timer
	var advanced atomic.Bool
	done := make(chan struct{})
	tm = c.AfterFuncAt(start.Add(time.Second), func() {
		if !advanced.Load() {
			c.ResetAt(tm, c.Now(), 0)
		} else {
			close(done)
		}
	})
	f.Advance(time.Minute, nil)
	advanced.Store(true)
	if got := c.Since(start); got < time.Minute {
		t.Errorf("after Advance(1m): got %v, want at least 1m", got)
	}
	<-done // its last run, by the real clock
}

// Advance does not move time while a measured call is under way, so that
// the call's duration holds no move.
func TestAdvanceWaitsForMeasuredCalls(t *testing.T) {
	f := NewFake()
	c := f.Clock()
	end := c.Measure()
	start := c.Now()
	advanced := make(chan struct{})
	go func() {
		f.Advance(time.Minute, nil)
		close(advanced)
	}()
	select {
	case <-advanced:
		t.Fatal("Advance returned while a measured call was under way")
	case <-time.After(50 * time.Millisecond):
	}
	if took := c.Since(start); took > time.Second {
		t.Errorf("measured call took %v, want no move of the clock in it", took)
	}
	end()
	end() // a second call is harmless
	<-advanced
	if got := c.Since(start); got < time.Minute {
		t.Errorf("after the call and Advance(1m): got %v, want at least 1m", got)
	}
}
