package netlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// NewRueidis returns a Backend that runs scripts on client: a single-server,
// sentinel or cluster client. In a cluster, all keys of one lock share a hash
// slot, so scripts are routed to one node and never fail with CROSSSLOT. The
// client is the caller's to close.
//
// While waiters of the Backend are waiting for a lock, it subscribes to
// their release channels on the connection client sends its other
// commands on (Client.Receive), if that connection speaks RESP3 (CLIENT
// INFO says resp=3, asked once: Redis 7.0 and later), so waiting opens no
// connection. Otherwise (RESP2, Redis 6, miniredis) it keeps one dedicated
// connection of client (Client.Dedicate) subscribed to them, which rueidis
// pings when idle, as it does every connection, and closes it shortly after
// the last wait ends. For a cluster client it keeps one per master instead
// (a dedicated connection of the master's client in Client.Nodes),
// subscribed with SSUBSCRIBE to the channels of that master's slots
// (sharded pub/sub, Redis 7), and finds the masters with CLUSTER SLOTS:
// once when the first waiter waits, and again after a connection to a
// master failed (see HubConfig.Shard). On a cluster older than Redis 7.0,
// without sharded pub/sub, its waiters poll. A LockCtx waiting when the
// client is closed fails with an error matching ErrQuorum; a lock granted
// to it meanwhile over a dedicated connection, which rueidis leaves open,
// is passed on to the next waiter.
func NewRueidis(client rueidis.Client) Backend {
	if client == nil {
		return nil // New names the nil backend
	}
	b := &rueidisBackend{client: client}
	if client.Mode() == rueidis.ClientModeCluster {
		b.hub = NewHub(HubConfig{Shard: b.shard, ListenShard: b.listenShard})
	} else {
		b.hub = NewHub(HubConfig{Listen: b.listen})
	}
	return b
}

type rueidisBackend struct {
	client rueidis.Client
	hub    *Hub
	push   atomic.Int32 // a pushMode: where the Hub of a client that is not a cluster's listens
	// unanswered: the last call got no answer from the server (see Eval).
	unanswered atomic.Bool

	// slots maps a cluster's hash slots to their masters, from CLUSTER
	// SLOTS; nil until a waiter needs it, and again once a master's
	// connection failed. rueidis keeps a slot map of its own but does not
	// export it.
	slotsMu sync.Mutex
	slots   []slotRange
}

// A slotRange is an entry of CLUSTER SLOTS: the slots first to last, and
// the address of their master.
type slotRange struct {
	first, last int64
	master      string
}

// Eval runs s on the client (see rueidisEval).
//
// rueidis makes a call that comes while the client dials a connection wait
// for that dial, whatever the call's context: against a server that
// accepts connections and does not answer, as long as the dial's own bound
// (up to seconds). So after a call that got no answer from the server, and
// until one does, Eval runs each call on a goroutine of its own and
// returns at ctx's deadline: the caller waits for its own deadline only,
// and a call while the server answers costs no goroutine.
func (b *rueidisBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if !b.unanswered.Load() {
		reply, err := rueidisEval(ctx, b.client, s, keys, args)
		b.answered(err)
		return reply, err
	}
	type result struct {
		reply []int64
		err   error
	}
	done := make(chan result, 1) // the goroutine never waits for the caller
	go func() {
		reply, err := rueidisEval(ctx, b.client, s, keys, args)
		b.answered(err)
		done <- result{reply, err}
	}()
	select {
	case r := <-done:
		return r.reply, r.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.Canceled) {
			// A cancellation waits for the call: rueidis, told of it,
			// returns at once unless it waits for a dial; and a call
			// given up here might be sent after the next one of the
			// caller's (a leave of the queue it joins).
			r := <-done
			return r.reply, r.err
		}
		return nil, ctx.Err()
	}
}

// answered notes whether err, a call's, is an answer of the server: nil or
// an error reply. A call its caller cancelled tells nothing.
func (b *rueidisBackend) answered(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	_, reply := rueidis.IsRedisErr(err)
	if no := err != nil && !reply; b.unanswered.Load() != no {
		b.unanswered.Store(no)
	}
}

// rueidisEval runs s on c with EVALSHA, and EVAL on NOSCRIPT.
func rueidisEval(ctx context.Context, c rueidis.CoreClient, s *Script, keys, args []string) ([]int64, error) {
	reply, err := c.Do(ctx, c.B().Evalsha().Sha1(s.SHA1()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	if rerr, ok := rueidis.IsRedisErr(err); ok && rerr.IsNoScript() {
		reply, err = c.Do(ctx, c.B().Eval().Script(s.Source()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	}
	return reply, err
}

// closed returns rueidis.ErrClosing if the client has been closed (see
// closable), without I/O. rueidis has no method that says so; but Receive
// with a context that has ended returns at once either way: ErrClosing
// from a closed client's connection, which has no subscriptions left to
// look at, and the context's error from an open one, before anything is
// sent.
func (b *rueidisBackend) closed(context.Context) error {
	c := b.client
	err := c.Receive(endedCtx, c.B().Subscribe().Channel(closedProbe).Build(), func(rueidis.PubSubMessage) {})
	if errors.Is(err, rueidis.ErrClosing) {
		return err
	}
	return nil
}

// closedProbe is the channel closed names to Receive; nothing is ever
// subscribed to it.
const closedProbe = "netlock:closed-probe"

// endedCtx is a context that has ended, for closed.
var endedCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// evalClosed runs s, as Eval does, on the Hub's dedicated connection that
// listens on channel: rueidis's Close does not close a dedicated connection
// in use, so it outlives the client (see closable). Its subscriptions are
// dropped first: a server speaking RESP2 (or miniredis) runs no script on a
// subscribed connection. The Hub closes it next. A Hub that listened on the
// client's own connection (see pushable) lost its subscriptions with it:
// errNotListening.
func (b *rueidisBackend) evalClosed(ctx context.Context, channel string, s *Script, keys, args []string) ([]int64, error) {
	l, ok := b.hub.listener(channel).(*rueidisPubSub)
	if !ok {
		return nil, errNotListening
	}
	dc := l.dc
	unsubscribe := dc.B().Unsubscribe().Build()
	if l.sharded() {
		unsubscribe = dc.B().Sunsubscribe().Build()
	}
	if err := dc.Do(ctx, unsubscribe).Error(); err != nil {
		return nil, err
	}
	return rueidisEval(ctx, dc, s, keys, args)
}

// EvalWait runs s as Eval does, then WAIT replicas, sent together with the
// script (one round trip), and returns the script's reply and WAIT's count.
//
// rueidis sends a batch that contains a blocking command such as WAIT on a
// connection of its own, taken from its pool of dedicated connections, never
// on the connection it pipelines other goroutines' commands on: the script
// and WAIT share one connection, and WAIT waits for the script's writes.
// On a cluster client the batch is sent through Client.Dedicated instead,
// bound to the node of the lock's slot: the cluster client would follow a
// MOVED or ASK reply by sending the script alone to another node, and
// WAIT's count, from the first node, would then be about writes that are
// not the script's.
func (b *rueidisBackend) EvalWait(ctx context.Context, s *Script, keys, args []string, replicas int) (reply []int64, acked int, err error) {
	if b.client.Mode() != rueidis.ClientModeCluster {
		reply, acked, err = rueidisEvalWait(ctx, b.client, s, keys, args, replicas)
		return reply, acked, err
	}
	err = b.client.Dedicated(func(dc rueidis.DedicatedClient) error {
		reply, acked, err = rueidisEvalWait(ctx, dc, s, keys, args, replicas)
		return err
	})
	if addr, ok := movedTo(err); ok {
		// The slot moved (a failover): a dedicated connection does not
		// follow redirections. Once more, on the node named, and make the
		// client learn the new slot map (a keyed command that meets MOVED
		// refreshes it).
		b.client.Do(ctx, b.client.B().Pttl().Key(keys[0]).Build())
		if node := b.client.Nodes()[addr]; node != nil {
			reply, acked, err = rueidisEvalWait(ctx, node, s, keys, args, replicas)
		}
	}
	return reply, acked, err
}

// movedTo returns the address a MOVED error reply names.
func movedTo(err error) (string, bool) {
	rerr, ok := rueidis.IsRedisErr(err)
	if !ok {
		return "", false
	}
	return rerr.IsMoved()
}

func rueidisEvalWait(ctx context.Context, c rueidis.CoreClient, s *Script, keys, args []string, replicas int) ([]int64, int, error) {
	script := c.B().Evalsha().Sha1(s.SHA1()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	reply, acked, err := rueidisDoWait(ctx, c, script, replicas)
	if rerr, ok := rueidis.IsRedisErr(err); ok && rerr.IsNoScript() {
		script = c.B().Eval().Script(s.Source()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		reply, acked, err = rueidisDoWait(ctx, c, script, replicas)
	}
	return reply, acked, err
}

// rueidisDoWait sends script and WAIT replicas in one batch and returns
// their replies; the script's error first.
func rueidisDoWait(ctx context.Context, c rueidis.CoreClient, script rueidis.Completed, replicas int) ([]int64, int, error) {
	wait := c.B().Wait().Numreplicas(int64(replicas)).Timeout(WaitTimeout(ctx).Milliseconds()).Build()
	res := c.DoMulti(ctx, script, wait)
	reply, err := res[0].AsIntSlice()
	if err != nil {
		return nil, 0, err
	}
	acked, err := res[1].AsInt64()
	if err != nil {
		return nil, 0, err
	}
	return reply, int(acked), nil
}

// Final reports whether err is an error reply of the server or means the
// client was closed.
//
// A Redis Cluster's answers while its slots move (MOVED, ASK, TRYAGAIN,
// CLUSTERDOWN) are not final: a failover under way gives them, and the
// same call succeeds once it is over.
func (b *rueidisBackend) Final(err error) bool {
	if rerr, reply := rueidis.IsRedisErr(err); reply {
		_, moved := rerr.IsMoved()
		_, ask := rerr.IsAsk()
		return !moved && !ask && !rerr.IsTryAgain() && !rerr.IsClusterDown()
	}
	return errors.Is(err, rueidis.ErrClosing)
}

// Hub returns the backend's Hub, which listens on the client's own
// connection or on dedicated ones (see NewRueidis).
func (b *rueidisBackend) Hub() *Hub { return b.hub }

func (*rueidisBackend) boundsLazily() {}

// listen is the Hub's HubConfig.Listen: the client's own connection where
// it carries subscriptions (see pushable), else a dedicated connection.
func (b *rueidisBackend) listen(ctx context.Context, onMessage func(channel, payload string)) (Listener, error) {
	if pushable(ctx, b.client, &b.push) {
		return newRueidisPush(b.client, onMessage), nil
	}
	dc, _ := b.client.Dedicate()
	return newRueidisPubSub(dc, onMessage, nil), nil
}

// shard is the Hub's HubConfig.Shard: the master of channel's slot, from
// the slot map, read with CLUSTER SLOTS (bounded by ctx) if it is not
// known.
func (b *rueidisBackend) shard(ctx context.Context, channel string) (string, error) {
	slot := int64(keySlot(channel))
	b.slotsMu.Lock()
	defer b.slotsMu.Unlock()
	if b.slots == nil {
		slots, err := b.clusterSlots(ctx)
		if err != nil {
			return "", err
		}
		b.slots = slots
	}
	for _, r := range b.slots {
		if r.first <= slot && slot <= r.last {
			return r.master, nil
		}
	}
	return "", fmt.Errorf("netlock: CLUSTER SLOTS names no master for hash slot %d", slot)
}

// clusterSlots reads the slot map with CLUSTER SLOTS, from any node.
func (b *rueidisBackend) clusterSlots(ctx context.Context) ([]slotRange, error) {
	c := b.client
	entries, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("netlock: CLUSTER SLOTS: %w", err)
	}
	slots := make([]slotRange, 0, len(entries))
	for _, e := range entries {
		// [first, last, [ip, port, id, ...], replicas...]
		fields, err := e.ToArray()
		if err != nil || len(fields) < 3 {
			return nil, fmt.Errorf("netlock: CLUSTER SLOTS: unexpected entry %v", e)
		}
		master, err := fields[2].ToArray()
		if err != nil || len(master) < 2 {
			return nil, fmt.Errorf("netlock: CLUSTER SLOTS: unexpected master %v", fields[2])
		}
		first, err1 := fields[0].AsInt64()
		last, err2 := fields[1].AsInt64()
		ip, err3 := master[0].ToString()
		port, err4 := master[1].AsInt64()
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("netlock: CLUSTER SLOTS: unexpected entry %v: %w", e, err)
		}
		slots = append(slots, slotRange{first: first, last: last, master: net.JoinHostPort(ip, strconv.FormatInt(port, 10))})
	}
	return slots, nil
}

// forgetSlots drops the slot map: the next shard reads it again.
func (b *rueidisBackend) forgetSlots() {
	b.slotsMu.Lock()
	b.slots = nil
	b.slotsMu.Unlock()
}

// listenShard is the Hub's HubConfig.ListenShard: a dedicated connection to
// node, which must be one of the client's nodes (rueidis knows the masters).
func (b *rueidisBackend) listenShard(ctx context.Context, node string, onMessage func(channel, payload string)) (Listener, error) {
	n, ok := b.client.Nodes()[node]
	if !ok {
		b.forgetSlots()
		return nil, fmt.Errorf("netlock: cluster master %s is not among the client's nodes", node)
	}
	dc, _ := n.Dedicate()
	return newRueidisPubSub(dc, onMessage, b.forgetSlots), nil
}

// errUnsubscribed is Confirmed's error when a shard's server unsubscribed a
// channel by itself: its slot left the node.
var errUnsubscribed = errors.New("netlock: the server unsubscribed a channel (its hash slot moved)")

// newRueidisPubSub returns a Listener on dc. With failed set it listens
// with sharded pub/sub, and calls failed when the connection fails or the
// server refuses or drops a subscription.
func newRueidisPubSub(dc rueidis.DedicatedClient, onMessage func(channel, payload string), failed func()) *rueidisPubSub {
	c := &rueidisPubSub{dc: dc, failed: failed, notify: make(chan struct{}, 1), closed: make(chan struct{}), unsubs: make(map[string]int)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	kind := "subscribe"
	if c.sharded() {
		kind = "ssubscribe"
	}
	// The hooks run on rueidis's reading goroutine. Messages are dispatched
	// from there (the hub's registry lock is never held across I/O);
	// confirmations go to an unbounded queue read by the hub, which may be
	// sending a SUBSCRIBE that waits for this very goroutine.
	c.errs = dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) {
			if !c.broken.Load() {
				onMessage(m.Channel, m.Message)
			}
		},
		OnSubscription: func(s rueidis.PubSubSubscription) {
			switch {
			case s.Kind == kind:
				c.push(s.Channel, nil)
			case s.Kind == "sunsubscribe" && !c.asked(s.Channel):
				// What this connection hears from now on may be a
				// replica's: nothing is passed on.
				c.broken.Store(true)
				c.push("", fmt.Errorf("%w: %s", errUnsubscribed, s.Channel))
			}
		},
	})
	return c
}

// A rueidisPubSub is a Listener on a dedicated connection.
type rueidisPubSub struct {
	dc     rueidis.DedicatedClient
	failed func()       // nil unless sharded
	errs   <-chan error // closed when the hooks will not be called any more
	notify chan struct{}
	closed chan struct{}
	// ctx ends with Close: it bounds the check that a shard's server is the
	// master of a confirmed channel's slot.
	ctx    context.Context
	cancel context.CancelFunc
	broken atomic.Bool // the server dropped a subscription by itself

	mu     sync.Mutex
	queue  []confirmation
	unsubs map[string]int // per channel, SUNSUBSCRIBEs sent and not yet confirmed
	closer sync.Once
}

// A confirmation is a channel whose subscription the server confirmed, or
// the error that ends the listener.
type confirmation struct {
	channel string
	err     error
}

func (c *rueidisPubSub) sharded() bool { return c.failed != nil }

func (c *rueidisPubSub) push(channel string, err error) {
	c.mu.Lock()
	c.queue = append(c.queue, confirmation{channel, err})
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// asked reports whether an sunsubscribe of channel answers an SUNSUBSCRIBE
// of ours, and counts it.
func (c *rueidisPubSub) asked(channel string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch n := c.unsubs[channel]; n {
	case 0:
		return false
	case 1:
		delete(c.unsubs, channel)
	default:
		c.unsubs[channel] = n - 1
	}
	return true
}

func (c *rueidisPubSub) Subscribe(ctx context.Context, channel string) error {
	cmd := c.dc.B().Subscribe().Channel(channel).Build()
	if c.sharded() {
		cmd = c.dc.B().Ssubscribe().Channel(channel).Build()
	}
	err := c.dc.Do(ctx, cmd).Error()
	if err != nil && c.sharded() {
		c.failed() // a MOVED reply: the slot map is stale
	}
	return err
}

func (c *rueidisPubSub) Unsubscribe(ctx context.Context, channel string) error {
	if !c.sharded() {
		return c.dc.Do(ctx, c.dc.B().Unsubscribe().Channel(channel).Build()).Error()
	}
	c.mu.Lock()
	c.unsubs[channel]++ // before it is sent: the reply may be read at once
	c.mu.Unlock()
	return c.dc.Do(ctx, c.dc.B().Sunsubscribe().Channel(channel).Build()).Error()
}

func (c *rueidisPubSub) Confirmed() (string, error) {
	ch, err := c.next()
	if err == nil && c.sharded() {
		// Sent after the confirmation, so run after the SSUBSCRIBE: a
		// replica, which accepts SSUBSCRIBE, answers it with MOVED.
		err = c.dc.Do(c.ctx, c.dc.B().Exists().Key(ch).Build()).Error()
	}
	if err != nil && c.sharded() {
		select {
		case <-c.closed:
		default:
			c.failed()
		}
	}
	return ch, err
}

// next returns the next confirmation.
func (c *rueidisPubSub) next() (string, error) {
	for {
		c.mu.Lock()
		if len(c.queue) > 0 {
			q := c.queue[0]
			c.queue = c.queue[1:]
			c.mu.Unlock()
			return q.channel, q.err
		}
		c.mu.Unlock()
		select {
		case <-c.notify:
		case err, ok := <-c.errs:
			if !ok || err == nil {
				err = errHubDown
			}
			return "", err
		case <-c.closed:
			return "", errHubDown
		}
	}
}

// close closes the dedicated connection rather than returning it to the
// pool: returning it would wait for an UNSUBSCRIBE round trip.
func (c *rueidisPubSub) Close() {
	c.closer.Do(func() {
		close(c.closed)
		c.cancel()
		c.dc.Close()
	})
}
