package netlock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Waiters are woken by the release script's PUBLISH on the lock's release
// channel. Each Backend made by NewRedigo or NewRueidis has one hub: at most
// one pub/sub connection, shared by every waiter of every NetMutex on that
// Backend, with one subscription per channel however many wait on it. A
// channel is unsubscribed when its last waiter leaves, and the connection is
// closed when no channel has been subscribed for hubLinger.
//
// A Backend without a hub (another implementation of Backend) still works:
// its waiters retry after jittered delays bounded by the holder's TTL.

// A subscriber is a Backend that can wake waiters on release. Like
// io.WriterTo, it is an optional ability found by type assertion.
type subscriber interface {
	pubsub() *hub
}

// hubLinger is how long an idle pub/sub connection stays open: long enough
// that a lock contended again and again does not dial for every wait, short
// enough that the reading goroutine does not outlive its use by much.
const hubLinger = 100 * time.Millisecond

// psConn is one pub/sub connection. Sends (subscribe, unsubscribe) are
// serialized by the hub; receive is called by one goroutine only, and close
// may be called concurrently with it, making it return an error.
type psConn interface {
	// subscribe sends SUBSCRIBE; its confirmation comes through receive.
	subscribe(ctx context.Context, channel string) error
	// unsubscribe sends UNSUBSCRIBE; its confirmation comes through receive.
	unsubscribe(ctx context.Context, channel string) error
	// receive blocks until the next confirmation or message.
	receive() (psEvent, error)
	close()
}

type psKind int

const (
	psSubscribed psKind = iota
	psUnsubscribed
	psMessage
)

type psEvent struct {
	kind    psKind
	channel string
}

// errHubDown is returned to a waiter whose subscription died with its
// connection before the server confirmed it.
var errHubDown = errors.New("netlock: pub/sub connection lost")

// A hub shares one pub/sub connection among the waiters of one Backend.
type hub struct {
	dial func(ctx context.Context) (psConn, error)

	mu     sync.Mutex
	conn   psConn        // nil when closed
	down   chan struct{} // closed when conn fails or is closed
	topics map[string]*topic
	// pending lists, per channel, the topics whose SUBSCRIBE the server has
	// not confirmed yet, in the order sent: the server confirms in order.
	pending map[string][]*topic
	idle    *time.Timer // closes conn after hubLinger without topics
}

// A topic is one subscribed channel and its waiters.
type topic struct {
	channel string
	ready   chan struct{} // closed when the server confirmed the subscription
	watches map[*watch]struct{}
}

// A watch is one waiter's interest in one channel of one hub. A release
// message on the channel, or the connection failing, is signalled on wake.
type watch struct {
	hub   *hub
	topic *topic
	wake  chan<- struct{} // capacity 1; shared by all watches of one waiter
	down  chan struct{}   // the connection's down channel
}

func newHub(dial func(ctx context.Context) (psConn, error)) *hub {
	return &hub{dial: dial, topics: make(map[string]*topic), pending: make(map[string][]*topic)}
}

// watch subscribes to channel, if no other waiter already has, and returns
// once the server has confirmed the subscription: every release published
// afterwards is signalled on wake. ctx bounds the dial and the wait for the
// confirmation. On error nothing is left subscribed for this waiter.
func (h *hub) watch(ctx context.Context, channel string, wake chan<- struct{}) (*watch, error) {
	h.mu.Lock()
	if h.idle != nil {
		h.idle.Stop() // if it already fired, closeIdle finds topics and does nothing
		h.idle = nil
	}
	if h.conn == nil {
		// Dialing under h.mu: the waiters of this hub that arrive meanwhile
		// need this same connection.
		conn, err := h.dial(ctx)
		if err != nil {
			h.mu.Unlock()
			return nil, err
		}
		h.conn, h.down = conn, make(chan struct{})
		go h.read(conn, h.down)
	}
	t := h.topics[channel]
	if t == nil {
		t = &topic{channel: channel, ready: make(chan struct{}), watches: make(map[*watch]struct{})}
		if err := h.conn.subscribe(ctx, channel); err != nil {
			h.failLocked(h.conn)
			h.mu.Unlock()
			return nil, err
		}
		h.topics[channel] = t
		h.pending[channel] = append(h.pending[channel], t)
	}
	w := &watch{hub: h, topic: t, wake: wake, down: h.down}
	t.watches[w] = struct{}{}
	h.mu.Unlock()

	select {
	case <-t.ready:
		return w, nil
	case <-w.down:
		w.stop()
		return nil, errHubDown
	case <-ctx.Done():
		w.stop()
		return nil, context.Cause(ctx)
	}
}

// dead reports whether the watch's connection has failed: the waiter must
// watch again, and attempt again, to be sure not to miss a release.
func (w *watch) dead() bool {
	select {
	case <-w.down:
		return true
	default:
		return false
	}
}

// stop ends the watch. The channel is unsubscribed when its last watch
// stops, and the connection closed after hubLinger without any.
func (w *watch) stop() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	t := w.topic
	delete(t.watches, w)
	if len(t.watches) > 0 || h.topics[t.channel] != t {
		return
	}
	delete(h.topics, t.channel)
	if len(h.topics) == 0 {
		// Closing the connection, soon, drops the subscription too.
		if h.conn != nil && h.idle == nil {
			h.idle = time.AfterFunc(hubLinger, h.closeIdle)
		}
	}
	if h.conn != nil {
		// Unbounded by a caller's context: the waiter is leaving and the
		// send is a write to a local socket buffer.
		ctx, cancel := context.WithTimeout(context.Background(), hubLinger)
		defer cancel()
		if err := h.conn.unsubscribe(ctx, t.channel); err != nil {
			h.failLocked(h.conn)
		}
	}
}

// closeIdle closes the connection if no channel has been subscribed since
// the timer was set.
func (h *hub) closeIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.idle = nil
	if len(h.topics) == 0 && h.conn != nil {
		h.failLocked(h.conn)
	}
}

// read dispatches the events of conn until it fails or is closed.
func (h *hub) read(conn psConn, down chan struct{}) {
	for {
		ev, err := conn.receive()
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
		switch ev.kind {
		case psSubscribed:
			if q := h.pending[ev.channel]; len(q) > 0 {
				close(q[0].ready)
				if len(q) == 1 {
					delete(h.pending, ev.channel)
				} else {
					h.pending[ev.channel] = q[1:]
				}
			}
		case psMessage:
			if t := h.topics[ev.channel]; t != nil {
				for w := range t.watches {
					w.signal()
				}
			}
		}
		h.mu.Unlock()
	}
}

// failLocked closes conn and forgets every subscription, waking every
// waiter: each watches again and makes an attempt, so a release that was
// published while the connection was failing is not missed.
func (h *hub) failLocked(conn psConn) {
	if h.conn != conn {
		return
	}
	conn.close()
	close(h.down)
	h.conn, h.down = nil, nil
	for _, t := range h.topics {
		for w := range t.watches {
			w.signal()
		}
	}
	clear(h.topics)
	clear(h.pending)
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
}

func (w *watch) signal() {
	select {
	case w.wake <- struct{}{}:
	default: // already signalled; one wake-up is enough
	}
}

// waitSet is the subscriptions of one waiting call: one watch per node
// whose Backend has a hub, all signalling one wake channel.
type waitSet struct {
	wake    chan struct{}
	watches []*watch // per node; nil where not watching
	// tries counts the watch attempts per node: a node that could not be
	// watched (down, stalled) is tried once more at most, so that waiting on
	// a sick node does not cost a node timeout every round; the delay
	// bounds how late its release is noticed.
	tries []int
}

// watchAll watches the release channel on every node that has a hub and is
// not watched yet (or whose watch died), in parallel when there are several,
// each bounded by the node timeout. It reports whether a new watch was set
// up: then an attempt must follow before waiting, for a release published
// before the subscription would not be signalled.
func (m *NetMutex) watchAll(ctx context.Context, ws *waitSet) bool {
	if ws.wake == nil {
		ws.wake = make(chan struct{}, 1)
		ws.watches = make([]*watch, len(m.nodes))
		ws.tries = make([]int, len(m.nodes))
	}
	var wg sync.WaitGroup
	fresh := make([]bool, len(m.nodes))
	for i, h := range m.hubs {
		if h == nil || ws.tries[i] >= 2 || (ws.watches[i] != nil && !ws.watches[i].dead()) {
			continue
		}
		ws.tries[i]++
		if ws.watches[i] != nil {
			ws.watches[i].stop()
			ws.watches[i] = nil
		}
		do := func() {
			ctx, cancel := context.WithTimeout(ctx, m.cfg.nodeTimeout)
			defer cancel()
			if w, err := h.watch(ctx, m.keys.channel, ws.wake); err == nil {
				ws.watches[i], fresh[i] = w, true
			}
		}
		if len(m.nodes) == 1 {
			do()
		} else {
			wg.Go(do)
		}
	}
	wg.Wait()
	for _, f := range fresh {
		if f {
			return true
		}
	}
	return false
}

// watching reports whether at least one node's release channel is watched.
func (ws *waitSet) watching() bool {
	for _, w := range ws.watches {
		if w != nil && !w.dead() {
			return true
		}
	}
	return false
}

// stop ends every watch of the call.
func (ws *waitSet) stop() {
	for i, w := range ws.watches {
		if w != nil {
			w.stop()
			ws.watches[i] = nil
		}
	}
}
