package redistest

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// proxyDialTimeout bounds the proxy's connection to its upstream.
const proxyDialTimeout = 5 * time.Second

// Proxy is a TCP proxy between clients and one upstream address, for tests
// that need a network that delays requests or replies. Each accepted
// connection gets a connection of its own to the upstream. Client→server
// bytes can be held back with SetDelay, server→client bytes with
// SetReplyDelay.
//
// A delayed connection behaves like a slow network, not like a slow server:
// each connection has its own queues, so a connection opened later is not
// held up by an older connection's delayed bytes, and its requests can reach
// the server first. Bytes a client sent before closing its connection are
// still delivered when they are due (packets in flight), and only then is
// the upstream connection closed; the server's bytes still due to a client
// that went away are dropped. Close drops every byte not yet due, in both
// directions: what a crash of either end, or a cut cable, loses.
type Proxy struct {
	t        testing.TB
	ln       net.Listener
	upstream string
	ctx      context.Context // cancelled by Close: ends dials and waits for due times
	cancel   context.CancelFunc
	wg       sync.WaitGroup // every proxy goroutine

	mu         sync.Mutex
	delay      time.Duration         // client→server
	replyDelay time.Duration         // server→client
	conns      map[net.Conn]struct{} // client and upstream connections, for Close
	closed     bool
}

// StartProxy listens on a free 127.0.0.1 port and forwards each accepted
// connection to upstream; stopped by t.Cleanup.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy: listen: %v", err)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		t:        t,
		ln:       ln,
		upstream: upstream,
		ctx:      ctx,
		cancel:   cancel,
		conns:    make(map[net.Conn]struct{}),
	}
	t.Cleanup(p.Close)
	p.wg.Add(1)
	go p.accept()
	return p
}

// Addr returns the address clients connect to, "127.0.0.1:PORT".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay makes every chunk of client→server bytes read from now on be
// delivered upstream d after it was read (0 = immediately). Order within one
// connection is preserved (a later chunk never overtakes an earlier one on the
// same connection), but a new connection opened later is not held up by an
// older connection's delayed bytes. Bytes already read keep the delay they
// were read with. Server→client bytes are not affected (see SetReplyDelay).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = max(d, 0)
	p.mu.Unlock()
}

// SetReplyDelay is SetDelay for the other direction: every chunk of
// server→client bytes read from now on is delivered to the client d after
// it was read, in order within its connection. For a replica connected
// through the proxy to its primary, these are the primary's replication
// stream: the delay is a replication lag that a Close (a primary killed,
// a link cut) turns into writes lost.
func (p *Proxy) SetReplyDelay(d time.Duration) {
	p.mu.Lock()
	p.replyDelay = max(d, 0)
	p.mu.Unlock()
}

func (p *Proxy) currentDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

func (p *Proxy) currentReplyDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replyDelay
}

// Close stops listening, closes all connections, and waits for every proxy
// goroutine. Bytes still waiting for their due time are dropped. Closing a
// closed Proxy does nothing.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closed = true
	p.cancel()
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers c so that Close closes it; it returns false (and closes c)
// if the proxy is already closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // listener closed
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// chunk is a piece of data and the time it is due at the other end.
type chunk struct {
	data []byte
	due  time.Time
}

// queue holds one direction of one connection's chunks in order.
type queue struct {
	mu     sync.Mutex
	chunks []chunk
	eof    bool          // the sending side ended: nothing more will be queued
	ready  chan struct{} // signalled (capacity 1) when a chunk or eof is added
}

func (q *queue) push(c chunk) {
	q.mu.Lock()
	q.chunks = append(q.chunks, c)
	q.mu.Unlock()
	q.signal()
}

func (q *queue) end() {
	q.mu.Lock()
	q.eof = true
	q.mu.Unlock()
	q.signal()
}

func (q *queue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop returns the oldest chunk, waiting for one. ok is false when the
// sending side ended and the queue is empty, or done is closed.
func (q *queue) pop(done <-chan struct{}) (c chunk, ok bool) {
	for {
		q.mu.Lock()
		if len(q.chunks) > 0 {
			c = q.chunks[0]
			q.chunks[0] = chunk{}
			q.chunks = q.chunks[1:]
			q.mu.Unlock()
			return c, true
		}
		eof := q.eof
		q.mu.Unlock()
		if eof {
			return chunk{}, false
		}
		select {
		case <-q.ready:
		case <-done:
			return chunk{}, false
		}
	}
}

// serve proxies one client connection. Four goroutines share it:
//   - read: client → requests, stamping each chunk with its due time;
//   - deliver (this goroutine): requests → upstream, each chunk at its due
//     time; when the client side has ended and everything is delivered, it
//     half-closes the upstream connection, so the server still reads it all;
//   - replies read: upstream → replies, stamped likewise, until the server
//     closes;
//   - replies delivered: replies → client, each chunk at its due time; once
//     the client is gone it discards the rest, so the server is not blocked,
//     and when the server has closed it closes the client.
//
// When all have ended, both connections are closed.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)

	d := net.Dialer{Timeout: proxyDialTimeout}
	up, err := d.DialContext(p.ctx, "tcp", p.upstream)
	if err != nil {
		return // the client sees its connection closed
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)

	requests := &queue{ready: make(chan struct{}, 1)}
	replies := &queue{ready: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // read
		defer wg.Done()
		stamp(client, requests, p.currentDelay)
	}()
	go func() { // replies read
		defer wg.Done()
		stamp(up, replies, p.currentReplyDelay)
	}()
	go func() { // replies delivered
		defer wg.Done()
		// Closing the client ends read; the requests queue may still hold
		// bytes, which deliver writes to the upstream connection (or fails
		// to).
		defer client.Close()
		if p.forward(replies, client) {
			return
		}
		// The client is gone (or the proxy closed): drop the server's
		// bytes until it closes.
		for {
			if _, ok := replies.pop(p.ctx.Done()); !ok {
				return
			}
		}
	}()

	if p.forward(requests, up) && p.ctx.Err() == nil {
		// The client side has ended and all its bytes are written.
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			up.Close()
		}
	} else if p.ctx.Err() == nil {
		up.Close() // the server is gone: replies read ends, and with it the client
	}
	wg.Wait()
}

// stamp reads src into q, each chunk due delay() after it was read, until
// src fails or ends; then it ends q.
func stamp(src net.Conn, q *queue, delay func() time.Duration) {
	defer q.end()
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			q.push(chunk{data: buf[:n], due: time.Now().Add(delay())})
		}
		if err != nil {
			return
		}
	}
}

// forward writes q's chunks to dst, each at its due time, until q ends
// (then it reports true), a write fails, or the proxy is closed (false:
// what is left is dropped).
func (p *Proxy) forward(q *queue, dst net.Conn) bool {
	done := p.ctx.Done()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		c, ok := q.pop(done)
		if !ok {
			return p.ctx.Err() == nil
		}
		if wait := time.Until(c.due); wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-done:
				return false
			}
		}
		if _, err := dst.Write(c.data); err != nil {
			return false
		}
	}
}
