package netlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Waiters are woken by the release script's PUBLISH. A release tells only
// the waiter whose turn it is (the head of the lock's waiters' queue), on
// that waiter's own channel, p{name}:released:<waiter id>: one NetMutex,
// whose goroutines share the one subscription. Each Subscriber has one Hub:
// at most one pub/sub connection, shared by every waiter of every NetMutex
// on that Backend. A channel is unsubscribed about hubLinger after its last
// watch stopped (a waiter that comes back meanwhile joins it without a round
// trip), and the connection is closed when no channel is subscribed.

// hubLinger is how long a subscription stays after its last waiter left:
// long enough that a lock contended again and again is not subscribed anew
// for every wait, short enough that the connection and its reading goroutine
// do not outlive their use by much.
const hubLinger = 100 * time.Millisecond

// errHubDown is returned to a waiter whose subscription died with its
// connection before the server confirmed it.
var errHubDown = errors.New("netlock: pub/sub connection lost")

// A Hub shares one pub/sub connection among the waiters of one Backend: it
// is what a Subscriber gives netlock. Make it with NewHub, once per Backend.
// Its methods are netlock's own; a Backend only hands it out. It also bounds
// the script calls netlock has in flight on the Backend, from all its
// NetMutexes (maxCalls), so that they take few connections of a pool that
// has no bound of its own.
//
// Two locks: mu orders the connection's life and its sends (a SUBSCRIBE is
// sent and its confirmation queued under mu); wmu guards the registry of
// topics and watches and is never held across I/O, so that a message can be
// dispatched from the connection's reading goroutine while a send waits.
// Lock order: mu, then wmu.
type Hub struct {
	listen func(ctx context.Context, onMessage func(channel, payload string)) (Listener, error)
	// counted: the count PUBLISH returns includes this hub's subscriptions,
	// so a release can tell a waiter nobody listens for. Not on a Redis
	// Cluster (HubConfig.Cluster), where PUBLISH counts only the subscribers
	// of the node it runs on, and ours may be connected to another.
	counted bool

	mu   sync.Mutex
	conn Listener      // nil when closed
	down chan struct{} // closed when conn fails or is closed
	// pending lists, per channel, the topics whose SUBSCRIBE the server has
	// not confirmed yet, in the order sent: the server confirms in order.
	pending map[string][]*topic
	sweep   *time.Timer // set while a topic has no watches: unsubscribes it

	wmu    sync.Mutex
	topics map[string]*topic

	// checked: a NetMutex of this Backend looked at its server's settings
	// (see NetMutex.checkServers). The Hub is the one per-Backend place
	// netlock has.
	checked atomic.Bool
	// calls bounds the script calls in flight on this Backend, from all
	// its NetMutexes.
	calls *limiter
}

// A topic is one subscribed channel and its waiters.
type topic struct {
	channel string
	ready   chan struct{} // closed when the server confirmed the subscription
	down    chan struct{} // its connection's down channel
	watches map[*watch]struct{}
	idle    time.Time // when its last watch stopped, if it has none
}

// A watch is one waiter's interest in one channel of one Hub. A message on
// the channel is signalled on wake with its payload; the connection failing,
// with "".
type watch struct {
	hub   *Hub
	topic *topic
	wake  chan<- string // capacity 1; shared by all watches of one waiter
}

// NewHub returns a Hub whose connections are opened by c.Listen. A Backend
// makes one, when it is made, and returns it from every call of its Hub
// method.
func NewHub(c HubConfig) *Hub {
	return &Hub{listen: c.Listen, counted: !c.Cluster, topics: make(map[string]*topic), pending: make(map[string][]*topic), calls: newLimiter()}
}

// watch subscribes to channel, if no other waiter already has, and returns
// once the server has confirmed the subscription: every release published
// afterwards is signalled on wake. ctx bounds the dial and the wait for the
// confirmation. On error nothing is left subscribed for this waiter.
func (h *Hub) watch(ctx context.Context, channel string, wake chan<- string) (*watch, error) {
	h.mu.Lock()
	if h.conn == nil {
		// Dialing under h.mu: the waiters of this hub that arrive meanwhile
		// need this same connection.
		conn, err := h.listen(ctx, h.dispatch)
		if err != nil {
			h.mu.Unlock()
			return nil, err
		}
		h.conn, h.down = conn, make(chan struct{})
		go h.read(conn)
	}
	h.wmu.Lock()
	t := h.topics[channel]
	h.wmu.Unlock()
	if t == nil {
		t = &topic{channel: channel, ready: make(chan struct{}), down: h.down, watches: make(map[*watch]struct{})}
		if err := h.conn.Subscribe(ctx, channel); err != nil {
			h.failLocked(h.conn)
			h.mu.Unlock()
			return nil, err
		}
		h.pending[channel] = append(h.pending[channel], t)
		h.wmu.Lock()
		h.topics[channel] = t
		h.wmu.Unlock()
	}
	w := &watch{hub: h, topic: t, wake: wake}
	h.wmu.Lock()
	t.watches[w] = struct{}{}
	h.wmu.Unlock()
	h.mu.Unlock()

	select {
	case <-t.ready:
		return w, nil
	case <-t.down:
		w.stop()
		return nil, errHubDown
	case <-ctx.Done():
		w.stop()
		return nil, context.Cause(ctx)
	}
}

// join watches channel if it is subscribed and confirmed already, without
// any I/O; it returns nil otherwise. A waiter that joins before its first
// attempt needs no attempt after subscribing.
func (h *Hub) join(channel string, wake chan<- string) *watch {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	t := h.topics[channel]
	if t == nil {
		return nil
	}
	select {
	case <-t.ready:
	default:
		return nil
	}
	w := &watch{hub: h, topic: t, wake: wake}
	t.watches[w] = struct{}{}
	return w
}

// subscribed reports whether channel has a subscription (confirmed or not).
func (h *Hub) subscribed(channel string) bool {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	return h.topics[channel] != nil
}

// dead reports whether the watch's connection has failed: the waiter must
// watch again, and attempt again, to be sure not to miss a release.
func (w *watch) dead() bool {
	select {
	case <-w.topic.down:
		return true
	default:
		return false
	}
}

// stop ends the watch. A channel left without watches stays subscribed
// for about hubLinger, then is unsubscribed; the connection is closed with
// the last channel.
func (w *watch) stop() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wmu.Lock()
	defer h.wmu.Unlock()
	t := w.topic
	delete(t.watches, w)
	if len(t.watches) > 0 || h.topics[t.channel] != t {
		return
	}
	t.idle = time.Now()
	if h.sweep == nil {
		h.sweep = time.AfterFunc(hubLinger, h.sweepIdle)
	}
}

// sweepIdle unsubscribes the channels that have had no watch for hubLinger,
// and closes the connection when none is left.
func (h *Hub) sweepIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep = nil
	if h.conn == nil {
		return
	}
	var idle []string
	var next time.Duration // until the next topic is due, if any
	h.wmu.Lock()
	for ch, t := range h.topics {
		if len(t.watches) > 0 {
			continue
		}
		if left := hubLinger - time.Since(t.idle); left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		delete(h.topics, ch)
		idle = append(idle, ch)
	}
	empty := len(h.topics) == 0
	h.wmu.Unlock()
	if empty {
		h.failLocked(h.conn) // closing the connection drops the subscriptions
		return
	}
	for _, ch := range idle {
		// The send is a write to a local socket buffer; a caller's context
		// has nothing to do with it.
		ctx, cancel := context.WithTimeout(context.Background(), hubLinger)
		err := h.conn.Unsubscribe(ctx, ch)
		cancel()
		if err != nil {
			h.failLocked(h.conn)
			return
		}
	}
	if next > 0 {
		h.sweep = time.AfterFunc(next, h.sweepIdle)
	}
}

// dispatch signals the watches of channel that a message was published on
// it: a release naming the channel's waiter (a NetMutex's own channel, see
// NetMutex.waitChan), or granting it the lock. It is called by the
// connection's reading goroutine; a message from a connection that has just
// failed is harmless, a wake-up being only a reason to look.
func (h *Hub) dispatch(channel, payload string) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	if t := h.topics[channel]; t != nil {
		for w := range t.watches {
			w.signal(payload)
		}
	}
}

// read handles the confirmations of conn until it fails or is closed.
func (h *Hub) read(conn Listener) {
	for {
		channel, err := conn.Confirmed()
		h.mu.Lock()
		if h.conn != conn {
			h.mu.Unlock()
			return
		}
		if err != nil {
			h.failLocked(conn)
			h.mu.Unlock()
			return
		}
		if q := h.pending[channel]; len(q) > 0 {
			close(q[0].ready)
			if len(q) == 1 {
				delete(h.pending, channel)
			} else {
				h.pending[channel] = q[1:]
			}
		}
		h.mu.Unlock()
	}
}

// failLocked closes conn and forgets every subscription, waking every
// waiter: each watches again and makes an attempt, so a release that was
// published while the connection was failing is not missed.
func (h *Hub) failLocked(conn Listener) {
	if h.conn != conn {
		return
	}
	conn.Close()
	close(h.down)
	h.conn, h.down = nil, nil
	h.wmu.Lock()
	for _, t := range h.topics {
		for w := range t.watches {
			w.signal("")
		}
	}
	clear(h.topics)
	h.wmu.Unlock()
	clear(h.pending)
	if h.sweep != nil {
		h.sweep.Stop()
		h.sweep = nil
	}
}

// signal passes payload to the waiter, unless a wake-up is pending already:
// then the waiter attempts anyway, and an attempt finds whatever a lost
// payload said (a lock granted to it is adopted by its next attempt, see
// lua/acquire.lua).
func (w *watch) signal(payload string) {
	select {
	case w.wake <- payload:
	default:
	}
}
