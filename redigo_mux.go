package netlock

import (
	"context"
	"errors"
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
// A reply that does not come by the latest deadline of the calls waiting
// for one means the server or the connection stalled: the connection is
// closed, every call waiting on it fails with the read's error, and the
// next call dials anew. A call whose own deadline passes before its reply
// returns its context's error at once; its reply is read and dropped.
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
	latest  time.Time // the latest deadline of the calls waiting (or answered since the reader began)
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
	done     chan redigoReply // buffered: the reader never waits for the caller
}

type redigoReply struct {
	reply any
	err   error
}

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
	call.deadline = dl
	mc.pending = append(mc.pending, call)
	// The reader gives up on the connection when no reply came by the
	// latest deadline of the calls waiting: a call whose deadline is the
	// latest so far (the usual case: calls sent later end later) is bounded
	// by its deadline without a timer of its own.
	latest := !dl.Before(mc.latest)
	if latest {
		mc.latest = dl
	}
	m.lastUse = time.Now()
	if !mc.reading {
		mc.reading = true
		go m.read(mc)
	}
	m.mu.Unlock()

	if latest {
		r := <-call.done
		muxedPool.Put(call)
		return r.reply, r.err, true
	}
	select {
	case r := <-call.done:
		muxedPool.Put(call)
		return r.reply, r.err, true
	case <-ctx.Done():
		return nil, ctxErr(ctx), true // call is the reader's to drop
	}
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
// call waits for one.
func (m *redigoMux) read(mc *muxConn) {
	for {
		m.mu.Lock()
		if len(mc.pending) == 0 || mc.broken {
			mc.reading = false
			mc.latest = time.Time{} // no call waits: the next one is the latest
			m.mu.Unlock()
			return
		}
		latest := mc.pending[0].deadline
		for _, c := range mc.pending[1:] {
			if c.deadline.After(latest) {
				latest = c.deadline
			}
		}
		m.mu.Unlock()

		timeout := DefaultNodeTimeout
		if !latest.IsZero() {
			timeout = max(time.Until(latest), lateRead)
		}
		reply, err := redis.ReceiveWithTimeout(mc.conn, timeout)
		var rerr redis.Error
		m.mu.Lock()
		if err != nil && !errors.As(err, &rerr) {
			// No reply by the latest deadline of the calls waiting, or
			// the connection failed.
			m.failLocked(mc, err)
		}
		if mc.broken { // here, or by a failed write meanwhile
			mc.reading = false
			m.mu.Unlock()
			return
		}
		call := mc.pending[0]
		mc.pending[0] = nil
		mc.pending = mc.pending[1:]
		m.mu.Unlock()
		call.done <- redigoReply{reply, err}
	}
}

// failLocked closes mc's connection, broken by err, and fails the calls
// waiting for its replies.
func (m *redigoMux) failLocked(mc *muxConn, err error) {
	if mc.broken {
		return
	}
	mc.broken = true
	mc.conn.Close()
	if m.cur == mc {
		m.cur = nil
	}
	for _, c := range mc.pending {
		c.done <- redigoReply{nil, err}
	}
	mc.pending = nil
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
	mc.broken = true
	mc.conn.Close()
	m.cur = nil
}
