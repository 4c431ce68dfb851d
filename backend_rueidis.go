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
