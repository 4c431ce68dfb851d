package netlock

import (
	"context"
	"sync"
	"time"
)

// A callBound is the context that bounds the calls of one fanout by the
// node timeout, for the Backends netlock provides (see lazyBound): ctx
// with the deadline by, whose Done channel and timer are made only when
// something asks for Done.
//
// The client libraries of those Backends bound a call by a socket deadline
// taken from Deadline, and look at Done only to wait for something else
// (rueidis: a reply of its pipeline shared with other goroutines; redigo: a
// connection of a full pool, or a dial). An uncontended call asks only for
// Deadline and Err, and so costs no timer and none of context.WithDeadline's
// allocations, which were a third of an uncontended lock's.
//
// It differs from a context.WithDeadline in one way only: context.Cause of
// a callBound whose own deadline passed is the cause of ctx (nil while ctx
// has not ended), since Cause looks for the nearest context of package
// context. The Backends that get one read Err (see ctxErr), never Cause
// alone; any other Backend gets a context.WithDeadline.
type callBound struct {
	parent context.Context
	by     time.Time

	mu         sync.Mutex
	done       chan struct{} // nil until Done is asked for
	err        error
	timer      *time.Timer // closes done at by; made with it
	stopParent func() bool // unhooks the close of done as ctx ends; made with it
}

// newCallBound returns the bound of calls that begin now: parent, with the
// deadline by.
func newCallBound(parent context.Context, by time.Time) *callBound {
	return &callBound{parent: parent, by: by}
}

func (c *callBound) Deadline() (time.Time, bool) { return c.by, true }

func (c *callBound) Value(key any) any { return c.parent.Value(key) }

// Err returns context.DeadlineExceeded once by has passed, ctx's error
// once ctx ended, nil before, like a context.WithDeadline's; it looks at
// the clock itself, so it needs no timer.
func (c *callBound) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errLocked()
}

func (c *callBound) errLocked() error {
	if c.err == nil {
		if err := c.parent.Err(); err != nil {
			c.endLocked(err)
		} else if !time.Now().Before(c.by) {
			c.endLocked(context.DeadlineExceeded)
		}
	}
	return c.err
}

// Done returns a channel closed when by passes or ctx ends. The first call
// makes it, and the timer and hook on ctx that close it.
func (c *callBound) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	err := c.errLocked() // before done exists: endLocked must not close it
	c.done = make(chan struct{})
	if err != nil {
		close(c.done)
		return c.done
	}
	c.timer = time.AfterFunc(time.Until(c.by), func() { c.end(context.DeadlineExceeded) })
	if c.parent.Done() != nil {
		c.stopParent = context.AfterFunc(c.parent, func() { c.end(c.parent.Err()) })
	}
	return c.done
}

func (c *callBound) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endLocked(err)
}

func (c *callBound) endLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}

// release stops the timer and the hook on ctx, if Done made them. The
// calls bounded by c have returned.
func (c *callBound) release() {
	c.mu.Lock()
	timer, stopParent := c.timer, c.stopParent
	c.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	if stopParent != nil {
		stopParent()
	}
}

// lazyBound reports whether b's calls may be bounded by a callBound: b is
// a Backend of netlock's own, whose client library is known to read the
// deadline and ask for Done only to wait (see callBound).
func lazyBound(b Backend) bool {
	_, ok := b.(lazyBounded)
	return ok
}

// A lazyBounded Backend says so (see lazyBound): redigo's and rueidis's.
type lazyBounded interface {
	// boundsLazily does nothing: its presence is the answer.
	boundsLazily()
}

// ctxErr returns ctx's cause if it has ended, or its error: a callBound
// whose own deadline passed has no cause of its own.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	return err
}
