package netlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// A redigoMux pipelines the concurrent script calls of a redigo Backend on
// one connection of its own, as rueidis pipelines every call: each call is
// written as it comes, and one goroutine reads the replies in order and
// hands each to its caller. Where a call of its own connection costs a
// write and a read on both sides, the server reads the calls that arrived
// together in one read and writes their replies in one write, and the
// client reads them in one: with 64 goroutines locking keys of their own
// this did 1.4–2.1× the lock+unlock pairs of a connection per call (see
// BenchmarkLockUnlockKeys).
//
// A call joins the pipeline only while another call of the Backend is in
// flight: a single caller, the usual case, takes a connection of the pool
// as before, with the pool's own checks and limits. The pipeline's
// connection is dialed with the pool's Dial function by the first call that
// finds none (other calls meanwhile use the pool), kept out of the pool,
// and closed once no call used it for muxIdle. The pool's TestOnBorrow
// function, if any, is asked about it as about an idle connection of the
// pool, whenever a call finds no other waiting on it.
//
// Each call waits for its reply until its own deadline, never another's:
// the reader reads without a deadline, and one timer per connection wakes
// the calls that have no timer of their own (the usual case: a call whose
// deadline is the latest so far) at their deadlines. A call whose deadline
// passes before its reply returns its context's error; its reply is read and
// dropped. The timer also ends a stall: once every call pending has
// passed its deadline (and lateRead more) without a reply, the server or the
// connection stalled: the connection is closed, the calls still waiting
// fail with a timeout, and the next call dials anew.
type redigoMux struct {
	pool *redis.Pool

	mu       sync.Mutex
	cur      *muxConn // nil: none; the next call that joins dials one
	dialing  bool
	failedAt time.Time // the last dial failed then: no other for muxRedial
	lastUse  time.Time
	idle     *time.Timer // closes cur's connection muxIdle after lastUse
}

// A muxConn is a connection of the pipeline and the calls sent on it.
type muxConn struct {
	conn    redis.Conn
	pending []*redigoMuxed // sent, in order, waiting for their replies
	reading bool           // a goroutine reads the replies (while pending is not empty)
	broken  bool
	latest  time.Time // the latest deadline of the calls sent since the reader began

	// timer runs expire at timerAt (zero: not set). While calls are
	// pending it is set, no later than the deadline of any call on it
	// (see redigoMuxed) still waiting.
	timer   *time.Timer
	timerAt time.Time
}

const (
	// muxIdle is how long the pipeline's connection stays open unused.
	muxIdle = 2 * time.Second
	// muxRedial is how long after a failed dial the pipeline waits before
	// it dials again (its calls take connections of the pool meanwhile).
	muxRedial = time.Second
)

// A redigoMuxed is one call sent on the pipeline's connection.
type redigoMuxed struct {
	deadline time.Time
	onTimer  bool             // no timer of its own: the connection's wakes it at deadline
	woken    bool             // woken by the timer: its reply, when read, is dropped
	done     chan redigoReply // buffered: the reader never waits for the caller
}

type redigoReply struct {
	reply any
	err   error
	woken bool // the call is still pending: its caller must not recycle it
}

// errMuxStalled fails the calls still waiting on the pipeline's connection
// when it is closed because no reply came by the latest of their deadlines.
// It matches os.ErrDeadlineExceeded, as the i/o timeout of a connection of
// the pool does: the calls may have run.
var errMuxStalled = fmt.Errorf("netlock: no reply on the pipelined connection by the deadline of its calls: %w", os.ErrDeadlineExceeded)

// eval sends EVALSHA argv on the pipeline's connection and waits for its
// reply, bounded by ctx. ok is false when the call was not sent: no
// connection to send on (none dialed yet, or a dial failed), or the write
// failed; the caller then takes one of the pool.
func (m *redigoMux) eval(ctx context.Context, argv []any) (reply any, err error, ok bool) {
	dl, _ := ctx.Deadline() // netlock's calls always have one (the node timeout)
	m.mu.Lock()
	if m.cur != nil && !m.cur.reading && !m.testOnBorrow(ctx) {
		m.mu.Unlock()
		return nil, nil, false
	}
	if m.cur == nil && !m.dial(ctx) {
		m.mu.Unlock()
		return nil, nil, false
	}
	mc := m.cur
	err = mc.conn.Send("EVALSHA", argv...)
	if err == nil {
		err = mc.conn.Flush()
	}
	if err != nil {
		// The write failed: the connection is broken (redigo takes any
		// error of Send or Flush as fatal; a server that closed it, or a
		// restart, is found so), and the replies of the calls sent before
		// will not come either. The call did not reach the server whole:
		// the caller sends it on a connection of the pool.
		m.failLocked(mc, err)
		m.mu.Unlock()
		return nil, nil, false
	}
	call := muxedPool.Get().(*redigoMuxed)
	call.deadline, call.woken = dl, false
	if dl.IsZero() {
		call.deadline = time.Now().Add(DefaultNodeTimeout) // when the connection counts as stalled
	}
	// A call whose deadline is the latest so far (the usual case: calls
	// sent later end later) costs no timer of its own: the connection's
	// timer, set no later than its deadline, wakes it then if its reply
	// has not come. A call with a deadline earlier than one sent before
	// waits on its context's Done. A call on the connection's timer notices
	// a cancellation of its context only when its reply comes, by its
	// deadline, as a call on a connection of the pool does (see evalOn).
	call.onTimer = !dl.IsZero() && !dl.Before(mc.latest)
	mc.latest = later(mc.latest, call.deadline)
	mc.pending = append(mc.pending, call)
	if call.onTimer && (mc.timerAt.IsZero() || dl.Before(mc.timerAt)) {
		m.setTimer(mc, dl)
	} else if mc.timerAt.IsZero() {
		m.setTimer(mc, call.deadline.Add(lateRead))
	}
	m.lastUse = time.Now()
	if !mc.reading {
		mc.reading = true
		go m.read(mc)
	}
	m.mu.Unlock()

	var r redigoReply
	if call.onTimer {
		r = <-call.done
	} else {
		select {
		case r = <-call.done:
		case <-ctx.Done():
			return nil, ctxErr(ctx), true // call is the reader's to drop
		}
	}
	if r.woken {
		if err := ctxErr(ctx); err != nil {
			return nil, err, true
		}
		return nil, context.DeadlineExceeded, true // ctx's own timer is a moment behind
	}
	muxedPool.Put(call)
	return r.reply, r.err, true
}

// muxedPool recycles the calls whose reply their caller took.
var muxedPool = sync.Pool{New: func() any {
	return &redigoMuxed{done: make(chan redigoReply, 1)}
}}

// testOnBorrow asks the pool's TestOnBorrow function (if any) whether the
// pipeline's connection, idle (no call waits on it), may still be used, as
// the pool asks of an idle connection it lends, with the time of its last
// use. If not, the connection is closed, and testOnBorrow reports false:
// the call takes a connection of the pool, and the next one dials anew.
// m.mu is held: a function that makes a round trip (a PING) holds up the
// calls that would join meanwhile, as the pool's Get holds up its caller.
func (m *redigoMux) testOnBorrow(ctx context.Context) bool {
	p, mc := m.pool, m.cur
	var err error
	switch {
	case p.TestOnBorrowContext != nil:
		err = p.TestOnBorrowContext(ctx, mc.conn, m.lastUse)
	case p.TestOnBorrow != nil:
		err = p.TestOnBorrow(mc.conn, m.lastUse)
	}
	if err != nil {
		m.failLocked(mc, err)
		return false
	}
	return true
}

// dial dials the pipeline's connection, with m.mu held on entry and on
// return (released while dialing). It reports whether there is one: false
// while another call dials, or after a failed dial.
func (m *redigoMux) dial(ctx context.Context) bool {
	if m.dialing || time.Since(m.failedAt) < muxRedial {
		return false
	}
	m.dialing = true
	m.mu.Unlock()
	var conn redis.Conn
	var err error
	if m.pool.DialContext != nil {
		conn, err = m.pool.DialContext(ctx)
	} else {
		conn, err = m.pool.Dial()
	}
	m.mu.Lock()
	m.dialing = false
	if err != nil {
		m.failedAt = time.Now()
		return false
	}
	m.cur = &muxConn{conn: conn} // nil until now: only one call dials
	m.lastUse = time.Now()
	if m.idle == nil {
		m.idle = time.AfterFunc(muxIdle, m.closeIdle)
	} else {
		m.idle.Reset(muxIdle)
	}
	return true
}

// read reads mc's replies and hands each to its call, in order, until no
// call waits for one. A read has no deadline: mc's timer closes the
// connection, which ends the read, once every call pending has passed its
// deadline (see expire). Closing a redigo connection while another goroutine
// reads it is safe: Close takes the connection's mutex, the read does not,
// and the net.Conn's Close ends a Read in progress with an error.
func (m *redigoMux) read(mc *muxConn) {
	for {
		m.mu.Lock()
		if len(mc.pending) == 0 || mc.broken {
			mc.reading = false
			mc.latest = time.Time{} // no call waits: the next one is the latest
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()

		reply, err := redis.ReceiveWithTimeout(mc.conn, 0) // 0: no deadline
		var rerr redis.Error
		m.mu.Lock()
		if err != nil && !errors.As(err, &rerr) {
			m.failLocked(mc, err) // the connection failed, or expire closed it
		}
		if mc.broken { // here, or by a failed write or expire meanwhile
			mc.reading = false
			m.mu.Unlock()
			return
		}
		call := mc.pending[0]
		mc.pending[0] = nil
		mc.pending = mc.pending[1:]
		woken := call.woken
		m.mu.Unlock()
		if !woken {
			call.done <- redigoReply{reply: reply, err: err}
		}
	}
}

// setTimer sets mc's timer to run expire at at, with m.mu held.
func (m *redigoMux) setTimer(mc *muxConn, at time.Time) {
	mc.timerAt = at
	if mc.timer == nil {
		mc.timer = time.AfterFunc(time.Until(at), func() { m.expire(mc) })
		return
	}
	mc.timer.Reset(time.Until(at))
}

// expire runs when mc's timer fires. It wakes the calls on the timer whose
// deadline has passed, each with a timeout (their caller returns its
// context's error). If every call pending has passed its deadline by
// lateRead, the connection stalled: expire closes it and fails the calls
// still waiting with errMuxStalled. Otherwise it sets the timer again, to
// the next deadline of a call on the timer, or else to lateRead after the
// latest deadline of the calls pending.
//
// Neither a reply nor a call with a timer of its own moves the timer: it
// may fire before it must, and is set again then. Under a steady load it
// fires about once per node timeout, where keeping it at the earliest
// deadline of the calls on it would cost a Reset per reply.
func (m *redigoMux) expire(mc *muxConn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mc.timerAt = time.Time{}
	if mc.broken || len(mc.pending) == 0 {
		return
	}
	now := time.Now()
	var next, latest time.Time
	for _, c := range mc.pending {
		latest = later(latest, c.deadline)
		switch {
		case !c.onTimer || c.woken:
		case !now.Before(c.deadline):
			c.woken = true
			c.done <- redigoReply{err: context.DeadlineExceeded, woken: true}
		case next.IsZero() || c.deadline.Before(next):
			next = c.deadline
		}
	}
	stall := latest.Add(lateRead)
	if !now.Before(stall) {
		m.failLocked(mc, errMuxStalled)
		return
	}
	if next.IsZero() {
		next = stall
	}
	m.setTimer(mc, next)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// failLocked closes mc's connection, broken by err, and fails the calls
// waiting for its replies.
func (m *redigoMux) failLocked(mc *muxConn, err error) {
	if mc.broken {
		return
	}
	m.closeLocked(mc)
	for _, c := range mc.pending {
		if !c.woken {
			c.done <- redigoReply{err: err}
		}
	}
	mc.pending = nil
}

// closeLocked closes mc's connection and stops its timer.
func (m *redigoMux) closeLocked(mc *muxConn) {
	mc.broken = true
	mc.conn.Close()
	if mc.timer != nil {
		mc.timer.Stop()
	}
	if m.cur == mc {
		m.cur = nil
	}
}

// closeIdle closes the pipeline's connection if no call used it for
// muxIdle.
func (m *redigoMux) closeIdle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	mc := m.cur
	if mc == nil {
		return // closed already; the next dial sets the timer again
	}
	if left := muxIdle - time.Since(m.lastUse); left > 0 || mc.reading {
		m.idle.Reset(max(left, muxIdle/4)) // reading: look again later
		return
	}
	m.closeLocked(mc)
}
