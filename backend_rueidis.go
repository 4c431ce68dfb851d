package netlock

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/rueidis"
)

// NewRueidis returns a Backend that runs scripts on client: a single-server,
// sentinel or cluster client. In a cluster, all keys of one lock share a hash
// slot, so scripts are routed to one node and never fail with CROSSSLOT. The
// client is the caller's to close.
//
// While waiters of the Backend are waiting for a lock, it keeps one
// dedicated connection of client (Client.Dedicate) subscribed to the release
// channels; it is closed shortly after the last wait ends.
func NewRueidis(client rueidis.Client) Backend {
	if client == nil {
		return nil // New names the nil backend
	}
	b := &rueidisBackend{client: client}
	b.hub = NewHub(HubConfig{Listen: b.listen, Cluster: client.Mode() == rueidis.ClientModeCluster})
	return b
}

type rueidisBackend struct {
	client rueidis.Client
	hub    *Hub
}

func (b *rueidisBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	c := b.client
	reply, err := c.Do(ctx, c.B().Evalsha().Sha1(s.SHA1()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	if rerr, ok := rueidis.IsRedisErr(err); ok && rerr.IsNoScript() {
		reply, err = c.Do(ctx, c.B().Eval().Script(s.Source()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	}
	return reply, err
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
	return reply, acked, err
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
func (b *rueidisBackend) Final(err error) bool {
	_, reply := rueidis.IsRedisErr(err)
	return reply || errors.Is(err, rueidis.ErrClosing)
}

// Hub returns the backend's Hub, whose connection is a dedicated one of the
// client.
func (b *rueidisBackend) Hub() *Hub { return b.hub }

func (b *rueidisBackend) listen(ctx context.Context, onMessage func(channel, payload string)) (Listener, error) {
	dc, _ := b.client.Dedicate()
	c := &rueidisPubSub{dc: dc, notify: make(chan struct{}, 1), closed: make(chan struct{})}
	// The hooks run on rueidis's reading goroutine. Messages are dispatched
	// from there (the hub's registry lock is never held across I/O);
	// confirmations go to an unbounded queue read by the hub, which may be
	// sending a SUBSCRIBE that waits for this very goroutine.
	c.errs = dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) { onMessage(m.Channel, m.Message) },
		OnSubscription: func(s rueidis.PubSubSubscription) {
			if s.Kind == "subscribe" {
				c.push(s.Channel)
			}
		},
	})
	return c, nil
}

type rueidisPubSub struct {
	dc     rueidis.DedicatedClient
	errs   <-chan error // closed when the hooks will not be called any more
	notify chan struct{}
	closed chan struct{}

	mu     sync.Mutex
	queue  []string // confirmed channels
	closer sync.Once
}

func (c *rueidisPubSub) push(channel string) {
	c.mu.Lock()
	c.queue = append(c.queue, channel)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *rueidisPubSub) Subscribe(ctx context.Context, channel string) error {
	return c.dc.Do(ctx, c.dc.B().Subscribe().Channel(channel).Build()).Error()
}

func (c *rueidisPubSub) Unsubscribe(ctx context.Context, channel string) error {
	return c.dc.Do(ctx, c.dc.B().Unsubscribe().Channel(channel).Build()).Error()
}

func (c *rueidisPubSub) Confirmed() (string, error) {
	for {
		c.mu.Lock()
		if len(c.queue) > 0 {
			ch := c.queue[0]
			c.queue = c.queue[1:]
			c.mu.Unlock()
			return ch, nil
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
		c.dc.Close()
	})
}
