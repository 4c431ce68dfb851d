package netlock

import (
	"context"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"
)

// An observer is one Observe call: its watches of the changes channel, one
// per node, what each node said last, when to look at each again, and what
// was delivered.
type observer struct {
	e       *Election
	out     chan<- Leader
	views   []nodeView
	wakes   []chan string // per node: the watch's messages ("" for a failed connection)
	watches []*watch      // per node; nil where not watching (no Hub, or failed)
	// look is, per node, when to look at it again: watch it if it is not
	// watched, and read it. Zero: only a message will tell.
	look  []time.Time
	msgs  chan nodeMsg // the forwarders' messages, by node
	timer *time.Timer

	last      Leader // the last delivered
	delivered bool
	next      Leader // to deliver, when pending
	pending   bool
}

// A nodeMsg is a message of node i's changes channel; lost says that some
// may have been dropped before it (its watch's buffer was full), or that
// the connection failed (payload "").
type nodeMsg struct {
	i       int
	payload string
	lost    bool
}

// observeBuffer is how many messages a node's watch keeps between two
// looks of its forwarder; beyond it they are dropped, and the node read
// again.
const observeBuffer = 16

func newObserver(e *Election, out chan<- Leader) *observer {
	n := len(e.m.nodes)
	o := &observer{e: e, out: out, views: make([]nodeView, n), wakes: make([]chan string, n),
		watches: make([]*watch, n), look: make([]time.Time, n), msgs: make(chan nodeMsg)}
	now := e.m.clk.Now()
	for i := range n {
		o.wakes[i] = make(chan string, observeBuffer)
		o.look[i] = now
	}
	return o
}

// run is the observer's goroutine: it watches, reads and delivers until
// ctx ends, then stops its watches and closes out. Its forwarders end
// before it returns.
func (o *observer) run(ctx context.Context) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range o.wakes {
		wg.Go(func() { o.forward(i, stop) })
	}
	clk := o.e.m.clk
	o.timer = clk.NewTimerAt(clk.Now().Add(time.Hour), 0)
	defer func() {
		close(stop)
		wg.Wait()
		for _, wt := range o.watches {
			if wt != nil {
				wt.stop()
			}
		}
		clk.Stop(o.timer)
		close(o.out)
	}()
	for ctx.Err() == nil {
		o.refresh(ctx)
		var send chan<- Leader
		if o.pending {
			send = o.out
		}
		select {
		case send <- o.next:
			o.last, o.delivered, o.pending = o.next, true, false
		case msg := <-o.msgs:
			o.take(msg)
		case <-o.timer.C:
		case <-ctx.Done():
		}
	}
}

// forward passes node i's messages to the observer's goroutine, tagged
// with i, until stop is closed.
func (o *observer) forward(i int, stop <-chan struct{}) {
	wake := o.wakes[i]
	for {
		var p string
		select {
		case p = <-wake:
		case <-stop:
			return
		}
		// A watch drops a message when its buffer is full: a buffer that
		// was full when this one was taken may have dropped one.
		msg := nodeMsg{i: i, payload: p, lost: p == "" || len(wake) >= cap(wake)-1}
		select {
		case o.msgs <- msg:
		case <-stop:
			return
		}
	}
}

// take applies a message of node i: a change newer than what the node last
// said replaces it; a lost message or a failed connection has the node
// looked at again at once.
func (o *observer) take(msg nodeMsg) {
	now := o.e.m.clk.Now()
	if msg.lost {
		o.look[msg.i] = now
	}
	if v, ok := parseChange(msg.payload, now); ok && v.newer(o.views[msg.i]) {
		o.views[msg.i] = v
		if !msg.lost {
			o.look[msg.i] = o.nextLook(msg.i, now)
		}
		o.judge()
	}
}

// refresh looks at the nodes due: watches those not watched, then reads
// them (a change made after the read is then told); and sets the timer for
// the next look.
func (o *observer) refresh(ctx context.Context) {
	e := o.e
	now := e.m.clk.Now()
	due := make([]bool, len(o.look))
	for i, at := range o.look {
		due[i] = !at.IsZero() && !now.Before(at)
	}
	if !slices.Contains(due, true) {
		o.arm()
		return
	}
	for i, h := range e.m.hubs {
		if due[i] && h != nil && !o.watching(i) {
			if old := o.watches[i]; old != nil {
				old.stop()
			}
			o.watches[i], _ = e.m.watchChannel(ctx, i, e.keys.Changes, o.wakes[i])
		}
	}
	views := slices.Clone(o.views)
	answered, _ := e.read(ctx, views, due)
	now = e.m.clk.Now()
	for i := range due {
		switch {
		case !due[i]:
		case answered[i]:
			o.views[i] = views[i]
			o.look[i] = o.nextLook(i, now)
		default:
			o.look[i] = now.Add(o.retry())
		}
	}
	o.judge()
	o.arm()
}

// watching reports whether node i's changes channel is watched.
func (o *observer) watching(i int) bool {
	return o.watches[i] != nil && !o.watches[i].dead()
}

// retry is how long after a failed read or watch a node is looked at
// again, and how often a node whose messages cannot be heard is read.
func (o *observer) retry() time.Duration {
	return max(o.e.m.cfg.expiry/extendsPerExpiry, time.Millisecond)
}

// nextLook returns when to look at node i next, after learning what it
// says at now: just after its leader's TTL runs out (with a little jitter,
// so that observers do not read together), or, where its messages cannot
// be heard, after retry; otherwise never (a message will tell).
func (o *observer) nextLook(i int, now time.Time) time.Time {
	var at time.Time
	if v := o.views[i]; v.leads {
		ttl := max(v.until.Sub(now), 0)
		at = v.until.Add(time.Millisecond + mrand.N(ttl/ttlJitter+time.Millisecond))
	}
	if !o.watching(i) {
		if r := now.Add(o.retry()); at.IsZero() || r.Before(at) {
			at = r
		}
	}
	return at
}

// arm sets the timer for the next look due.
func (o *observer) arm() {
	var at time.Time
	for _, t := range o.look {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	clk := o.e.m.clk
	if at.IsZero() {
		at = clk.Now().Add(time.Hour) // only a message can change anything
	}
	clk.Stop(o.timer)
	clk.ResetAt(o.timer, at, 0)
}

// judge sets what to deliver next, once enough nodes have been heard from
// to tell: the majority's leader (or nobody), if it is not the last
// delivered and not of an older term.
func (o *observer) judge() {
	l, v := majority(o.views, o.e.m.quorum)
	if v == unknown {
		return // wait to hear from more nodes
	}
	if o.delivered && l == o.last {
		o.pending = false
		return
	}
	if l.Term != 0 && l.Term < max(o.last.Term, o.next.Term) {
		return // an older term, told late: never after a newer one
	}
	o.next, o.pending = l, true
}
