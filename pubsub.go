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
//
// On a Redis Cluster whose Backend gives a shard map (HubConfig.Shard), the
// Hub uses sharded pub/sub instead: the scripts publish with SPUBLISH, which
// reaches only the nodes of the channel's shard (a channel shares the lock
// key's hash tag, so its slot), where PUBLISH would be relayed to every node
// of the cluster; and the Hub keeps one connection per master, each
// subscribed (SSUBSCRIBE) to the channels of that master's slots. Such a
// connection is a link of its own: its failure, a MOVED reply, or the server
// unsubscribing its channels (a slot that moved, as in a failover) wakes the
// waiters of that link only, and each watches again on the master that now
// serves its slot.

// hubLinger is how long a subscription stays after its last waiter left:
// long enough that a lock contended again and again is not subscribed anew
// for every wait, short enough that the connection and its reading goroutine
// do not outlive their use by much.
const hubLinger = 100 * time.Millisecond

// errHubDown is returned to a waiter whose subscription died with its
// connection before the server confirmed it.
var errHubDown = errors.New("netlock: pub/sub connection lost")

// errNotListening is a closable's evalClosed's error when no connection
// that outlived the Backend's closed client listens on the waiter's
// channel: the subscription went with the client's connection.
var errNotListening = errors.New("netlock: no pub/sub connection outlived the closed client")

// errClientGone is returned to a waiter that would watch a channel on a
// Hub whose Backend's client has been closed.
var errClientGone = errors.New("netlock: the Backend's client is closed")

// A Hub shares pub/sub connections among the waiters of one Backend: it is
// what a Subscriber gives netlock. Make it with NewHub, once per Backend.
// Its methods are netlock's own; a Backend only hands it out. It also bounds
// the script calls netlock has in flight on the Backend, from all its
// NetMutexes (at most 128 at once), so that they take few connections of a
// pool that has no bound of its own.
type Hub struct {
	listen func(ctx context.Context, onMessage func(channel, payload string)) (Listener, error)
	// shard, when set (HubConfig.Shard), makes the Hub sharded: one link
	// per master, which shard names and listenShard opens.
	shard       func(ctx context.Context, channel string) (node string, err error)
	listenShard func(ctx context.Context, node string, onMessage func(channel, payload string)) (Listener, error)
	// counted: the count the release's PUBLISH (SPUBLISH) returns includes
	// this hub's subscriptions, so a release can tell a waiter nobody
	// listens for. Not on a Redis Cluster without sharded pub/sub
	// (HubConfig.Cluster), where PUBLISH counts only the subscribers of the
	// node it runs on, and ours may be connected to another. With it,
	// SPUBLISH counts the subscribers of the master the script runs on,
	// where the link of its slot is (see HubConfig.ListenShard).
	counted bool

	// Two locks: mu orders the links' lives and their sends (a SUBSCRIBE is
	// sent and its confirmation queued under mu, a dial made under it);
	// wmu guards the registry of topics and watches and is never held
	// across I/O, so that a message can be dispatched from a connection's
	// reading goroutine, and a watch stopped, while a send or a dial waits
	// for a server that does not answer. Lock order: mu, then wmu.
	mu sync.Mutex
	// links holds the open links, by node ("" for the one link of a Hub
	// that is not sharded).
	links map[string]*link

	// gone: the Backend's client was found closed (see closable): the
	// links are closed, and none is opened any more.
	gone bool

	wmu    sync.Mutex
	topics map[string]*topic
	sweep  *time.Timer // set while a topic has no watches: unsubscribes it
	// left holds, by channel, the orphan handlers of the channels
	// unsubscribed lately (see leftKeep), on links still open.
	left map[string]leftTopic

	// checked: a NetMutex of this Backend looked at its server's settings
	// (see engine.checkServers). The Hub is the one per-Backend place
	// netlock has.
	checked atomic.Bool
	// channels holds the prefixes on whose channels the server said the
	// Backend's user may publish and subscribe (see
	// engine.checkChannels).
	channels sync.Map
	// calls bounds the script calls in flight on this Backend, from all
	// its NetMutexes.
	calls *limiter
}

// A link is one pub/sub connection of a Hub, and its subscriptions under
// way. Its fields are guarded by the Hub's mu.
type link struct {
	node string
	conn Listener
	down chan struct{} // closed when conn fails or is closed
	// err is the error conn failed with, if it did: set before down is
	// closed, read after.
	err error
	// pending lists, per channel, the topics whose SUBSCRIBE the server has
	// not confirmed yet, in the order sent: the server confirms in order.
	pending map[string][]*topic
}

// A topic is one subscribed channel and its waiters.
type topic struct {
	channel string
	link    *link
	ready   chan struct{} // closed when the server confirmed the subscription
	down    chan struct{} // its link's down channel
	watches map[*watch]struct{}
	idle    time.Time // when its last watch stopped, if it has none
	// orphan, if set, takes a message that comes while the topic has no
	// watch (see watchFor).
	orphan func(payload string)
}

// A leftTopic is what a Hub keeps of an unsubscribed channel that had an
// orphan handler: the server may have published a message on it before it
// had the UNSUBSCRIBE (a fault can hold the connection's bytes back for
// seconds), and a grant in such a message must still be given back rather
// than left to expire. It is kept for leftKeep, and dropped with its link.
type leftTopic struct {
	link   *link
	orphan func(payload string)
	at     time.Time // when the channel was unsubscribed
}

// leftKeep is how long a Hub passes the messages of a channel it
// unsubscribed to the channel's orphan handler. The handlers older are
// dropped by the next sweep (sweepIdle), or with their link.
const leftKeep = 30 * time.Second

// A watch is one waiter's interest in one channel of one Hub. A message on
// the channel is signalled on wake with its payload; the connection failing,
// with "".
type watch struct {
	hub   *Hub
	topic *topic
	wake  chan<- string // capacity 1; shared by all watches of one waiter
	// also are the watches of a MultiMutex's other names' channels on the
	// same Hub: they die and stop with this one (see engine.watch).
	also []*watch
}

// NewHub returns a Hub whose connections are opened by c.Listen, or, when
// c.Shard is set, by c.ListenShard, one per master. A Backend makes one,
// when it is made, and returns it from every call of its Hub method.
func NewHub(c HubConfig) *Hub {
	h := &Hub{listen: c.Listen, counted: !c.Cluster, links: make(map[string]*link), topics: make(map[string]*topic), left: make(map[string]leftTopic), calls: newLimiter()}
	if c.Shard != nil {
		h.shard, h.listenShard, h.counted = c.Shard, c.ListenShard, true
	}
	return h
}

// sharded reports whether h uses sharded pub/sub: then the release scripts
// publish with SPUBLISH.
func (h *Hub) sharded() bool { return h.shard != nil }

// usable returns an error naming what h lacks to open a connection.
func (h *Hub) usable() error {
	switch {
	case h.sharded() && h.listenShard == nil:
		return errors.New("its Hub has a Shard function but no ListenShard (HubConfig.ListenShard)")
	case !h.sharded() && h.listen == nil:
		return errors.New("its Hub has no Listen function (HubConfig.Listen)")
	}
	return nil
}

// watch subscribes to channel, if no other waiter already has, and returns
// once the server has confirmed the subscription: every release published
// afterwards is signalled on wake. ctx bounds finding the channel's shard,
// the dial and the wait for the confirmation. On error nothing is left
// subscribed for this waiter.
func (h *Hub) watch(ctx context.Context, channel string, wake chan<- string) (*watch, error) {
	return h.watchFor(ctx, channel, wake, nil)
}

// watchFor is watch for the owner of channel (a NetMutex's own release
// channel): a message on it that comes while no waiter watches it (the
// last one stopped, the channel not unsubscribed yet: see hubLinger; or
// unsubscribed within leftKeep, see leftTopic) is passed to orphan, called
// on the connection's reading goroutine, which it must not hold up. A
// release may grant the lock to a waiter whose place outlived it, and count
// this Hub as listening: orphan gives such a grant back at once, where
// nobody would take it up before it expired.
func (h *Hub) watchFor(ctx context.Context, channel string, wake chan<- string, orphan func(payload string)) (*watch, error) {
	node := ""
	if h.sharded() {
		// Before mu: a Backend may refresh its slot map here, and the
		// waiters of other shards need not wait for it.
		var err error
		if node, err = h.shard(ctx, channel); err != nil {
			return nil, err
		}
	}
	h.mu.Lock()
	if h.gone {
		h.mu.Unlock()
		return nil, errClientGone
	}
	h.wmu.Lock()
	t := h.topics[channel]
	h.wmu.Unlock()
	if t == nil {
		l := h.links[node]
		if l == nil {
			// Dialing under h.mu: the waiters of this hub that arrive
			// meanwhile need this same connection (or, sharded, may need
			// it).
			var err error
			if l, err = h.dial(ctx, node); err != nil {
				h.mu.Unlock()
				return nil, err
			}
		}
		t = &topic{channel: channel, link: l, ready: make(chan struct{}), down: l.down, watches: make(map[*watch]struct{})}
		if err := l.conn.Subscribe(ctx, channel); err != nil {
			h.failLocked(l)
			h.mu.Unlock()
			if aclRefusal(err) {
				return nil, subscribeRefused(channel, err)
			}
			return nil, err
		}
		l.pending[channel] = append(l.pending[channel], t)
		h.wmu.Lock()
		h.topics[channel] = t
		delete(h.left, channel) // its messages are the new topic's now
		h.wmu.Unlock()
	}
	w := &watch{hub: h, topic: t, wake: wake}
	h.wmu.Lock()
	t.watches[w] = struct{}{}
	if orphan != nil {
		t.orphan = orphan
	}
	h.wmu.Unlock()
	h.mu.Unlock()

	select {
	case <-t.ready:
		return w, nil
	case <-t.down:
		w.stop()
		if err := t.link.err; aclRefusal(err) {
			// The server refused the SUBSCRIBE: watching again, or
			// polling, would hide it (see engine.checkChannels).
			return nil, subscribeRefused(channel, err)
		}
		return nil, errHubDown
	case <-ctx.Done():
		w.stop()
		return nil, context.Cause(ctx)
	}
}

// dial opens the link to node ("" when h is not sharded) and starts reading
// it. The caller holds h.mu.
func (h *Hub) dial(ctx context.Context, node string) (*link, error) {
	l := &link{node: node, down: make(chan struct{}), pending: make(map[string][]*topic)}
	onMessage := func(channel, payload string) { h.dispatch(l, channel, payload) }
	var err error
	if h.sharded() {
		l.conn, err = h.listenShard(ctx, node, onMessage)
	} else {
		l.conn, err = h.listen(ctx, onMessage)
	}
	if err != nil {
		return nil, err
	}
	h.links[node] = l
	go h.read(l)
	return l, nil
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

// listener returns the Listener through which channel is subscribed, nil
// if it is not.
func (h *Hub) listener(channel string) Listener {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	if t := h.topics[channel]; t != nil {
		return t.link.conn // set when the link is dialed, never changed
	}
	return nil
}

// clientClosed closes h's links, waking their waiters, whose attempts then
// fail, and opens none any more: the Backend's client has been closed
// (see closable), and a release must count no waiter of it.
func (h *Hub) clientClosed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gone = true
	for _, l := range h.links {
		h.failLocked(l)
	}
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
	for _, a := range w.also {
		if a.dead() {
			return true
		}
	}
	select {
	case <-w.topic.down:
		return true
	default:
		return false
	}
}

// stop ends the watch. A channel left without watches stays subscribed
// for about hubLinger, then is unsubscribed; a link is closed with its last
// channel. It never waits for I/O: not for mu, under which another waiter
// of the Hub may be dialing a server that does not answer (an unlock that
// stops its watches must not wait out a node timeout, its hold's deadline
// running).
func (w *watch) stop() {
	for _, a := range w.also {
		a.stop()
	}
	h := w.hub
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
// and closes the links left without a channel.
func (h *Hub) sweepIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wmu.Lock()
	h.sweep = nil
	if len(h.links) == 0 {
		h.wmu.Unlock()
		return
	}
	idle := map[*link][]string{}
	used := map[*link]bool{} // links left with a channel
	var next time.Duration   // until the next topic is due, if any
	now := time.Now()
	for ch, lt := range h.left {
		if now.Sub(lt.at) >= leftKeep {
			delete(h.left, ch)
		}
	}
	for ch, t := range h.topics {
		if len(t.watches) > 0 {
			used[t.link] = true
			continue
		}
		if left := hubLinger - time.Since(t.idle); left > 0 {
			used[t.link] = true
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		delete(h.topics, ch)
		idle[t.link] = append(idle[t.link], ch)
		if t.orphan != nil {
			h.left[ch] = leftTopic{link: t.link, orphan: t.orphan, at: now}
		}
	}
	h.wmu.Unlock()
	for _, l := range h.links {
		if !used[l] {
			h.failLocked(l) // closing the connection drops the subscriptions
			continue
		}
		for _, ch := range idle[l] {
			// The send is a write to a local socket buffer; a caller's
			// context has nothing to do with it.
			ctx, cancel := context.WithTimeout(context.Background(), hubLinger)
			err := l.conn.Unsubscribe(ctx, ch)
			cancel()
			if err != nil {
				h.failLocked(l)
				break
			}
		}
	}
	h.wmu.Lock()
	// A watch stopped meanwhile may have set the timer already.
	if next > 0 && len(h.links) > 0 && h.sweep == nil {
		h.sweep = time.AfterFunc(next, h.sweepIdle)
	}
	h.wmu.Unlock()
}

// dispatch signals the watches of channel that a message was published on
// it: a release naming the channel's waiter (a NetMutex's own channel, see
// engine.waitChan), or granting it the lock. It is called by the reading
// goroutine of l's connection, and ignores a channel subscribed through
// another link (a message of a connection that has just failed, whose
// channel is now subscribed again elsewhere).
func (h *Hub) dispatch(l *link, channel, payload string) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	t := h.topics[channel]
	switch {
	case t == nil:
		if lt, ok := h.left[channel]; ok && lt.link == l && time.Since(lt.at) < leftKeep {
			lt.orphan(payload)
		}
	case t.link != l:
	case len(t.watches) == 0 && t.orphan != nil:
		t.orphan(payload)
	default:
		for w := range t.watches {
			w.signal(payload)
		}
	}
}

// read handles the confirmations of l's connection until it fails or is
// closed.
func (h *Hub) read(l *link) {
	for {
		channel, err := l.conn.Confirmed()
		h.mu.Lock()
		if h.links[l.node] != l {
			h.mu.Unlock()
			return
		}
		if err != nil {
			l.err = err
			h.failLocked(l)
			h.mu.Unlock()
			return
		}
		if q := l.pending[channel]; len(q) > 0 {
			close(q[0].ready)
			if len(q) == 1 {
				delete(l.pending, channel)
			} else {
				l.pending[channel] = q[1:]
			}
		}
		h.mu.Unlock()
	}
}

// failLocked closes l's connection and forgets its subscriptions, waking
// their waiters: each watches again and makes an attempt, so a release
// that was published while the connection was failing is not missed. The
// other links of a sharded Hub are left as they are. The caller holds h.mu.
func (h *Hub) failLocked(l *link) {
	if h.links[l.node] != l {
		return
	}
	l.conn.Close()
	close(l.down)
	delete(h.links, l.node)
	h.wmu.Lock()
	for ch, t := range h.topics {
		if t.link != l {
			continue
		}
		for w := range t.watches {
			w.signal("")
		}
		delete(h.topics, ch)
	}
	for ch, lt := range h.left {
		if lt.link == l {
			delete(h.left, ch)
		}
	}
	if len(h.links) == 0 && h.sweep != nil {
		h.sweep.Stop()
		h.sweep = nil
	}
	h.wmu.Unlock()
	clear(l.pending)
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
