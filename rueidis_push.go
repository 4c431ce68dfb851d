package netlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// A rueidis client whose connection speaks RESP3 carries subscriptions on
// the connection it pipelines every other command on: rueidis's
// Client.Receive sends SUBSCRIBE there, and the server, in RESP3, still
// runs the client's scripts on it. A Hub on such a client then waits on
// that connection, which rueidis keeps (and pings when idle) whether
// netlock waits or not, instead of keeping a dedicated connection of its
// own, which rueidis pings too. Over RESP2, rueidis would subscribe on a
// connection of its own anyway, which it keeps until the client is
// closed; and miniredis, which speaks RESP3, runs no script on a
// subscribed connection. There the Hub keeps its dedicated connection.

// pushMode says, per Backend, whether its Hub waits on the client's own
// connection; pushUnknown until a Hub's first connection asked.
type pushMode int32

const (
	pushUnknown   pushMode = iota
	pushShared             // the client's own connection (rueidisPush)
	pushDedicated          // a dedicated connection (rueidisPubSub)
)

// pushable reports whether the Hub may wait on c's own connection: the
// server says, in CLIENT INFO, that the connection speaks RESP3 (resp=3,
// Redis 7.0 and later). Asked once per Backend, at the Hub's first
// connection (bounded by ctx); an answer that is not a reply of the server
// is not kept, and means no.
func pushable(ctx context.Context, c rueidis.Client, mode *atomic.Int32) bool {
	switch pushMode(mode.Load()) {
	case pushShared:
		return true
	case pushDedicated:
		return false
	}
	// rueidis sends a command that names no key, such as CLIENT INFO, on
	// the first of its pipelined connections, where it sends SUBSCRIBE and
	// UNSUBSCRIBE too (commands without a reply; mux.go, slotfn).
	info, err := c.Do(ctx, c.B().ClientInfo().Build()).ToString()
	if _, reply := rueidis.IsRedisErr(err); err != nil && !reply {
		return false
	}
	m := pushDedicated
	if err == nil && strings.Contains(" "+strings.TrimSpace(info)+" ", " resp=3 ") {
		m = pushShared
	}
	mode.Store(int32(m))
	return m == pushShared
}

// errUnasked is a rueidisPush's error when a subscription of its ended
// without its UNSUBSCRIBE (another user of the connection unsubscribed
// it).
var errUnasked = errors.New("netlock: a subscription ended without netlock's UNSUBSCRIBE")

// A rueidisPush is a Listener on the client's own connection. Each channel
// is subscribed by a Client.Receive of its own, running in a goroutine
// until its UNSUBSCRIBE, Close or a failure. Receive's messages come from
// that goroutine, in the order received, and rueidis's reading goroutine
// waits for it to take them: the Hub's dispatch takes no I/O.
type rueidisPush struct {
	client    rueidis.Client
	onMessage func(channel, payload string)
	// ctx ends with Close or a failure: it ends every Receive, and keeps
	// rueidis from subscribing again on a new connection, where a release
	// published in between would be missed unseen.
	ctx      context.Context
	cancel   context.CancelFunc
	notify   chan struct{}
	down     chan struct{} // closed by fail
	receives sync.WaitGroup
	closer   sync.Once

	mu     sync.Mutex
	queue  []string // channels confirmed, not yet returned by Confirmed
	err    error    // why it failed
	subs   map[string]bool
	unsubs map[string]int // per channel, UNSUBSCRIBEs sent whose Receive has not ended
}

func newRueidisPush(client rueidis.Client, onMessage func(channel, payload string)) *rueidisPush {
	c := &rueidisPush{client: client, onMessage: onMessage, notify: make(chan struct{}, 1), down: make(chan struct{}), subs: make(map[string]bool), unsubs: make(map[string]int)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// Subscribe starts the Receive that subscribes to channel; its send, its
// confirmation and its failure come to Confirmed.
func (c *rueidisPush) Subscribe(_ context.Context, channel string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	c.subs[channel] = true
	ctx := rueidis.WithOnSubscriptionHook(c.ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == "subscribe" && s.Channel == channel {
			c.confirm(channel)
		}
	})
	// Called when rueidis's Receive on one connection returns, before the
	// client would subscribe again on another: a failure fails the
	// listener, and its ended ctx stops the client from trying again.
	ctx = rueidis.WithOnReceiveReturnHook(ctx, func(err error, _ rueidis.CommandClient) error {
		if err != nil {
			c.fail(err)
		}
		return err
	})
	subscribe := c.client.B().Subscribe().Channel(channel).Build()
	c.receives.Add(1)
	go func() {
		defer c.receives.Done()
		err := c.client.Receive(ctx, subscribe, func(m rueidis.PubSubMessage) { c.onMessage(m.Channel, m.Message) })
		c.ended(channel, err)
	}()
	return nil
}

// ended handles the end of channel's Receive: the answer to our
// UNSUBSCRIBE, or a failure.
func (c *rueidisPush) ended(channel string, err error) {
	c.mu.Lock()
	asked := c.unsubs[channel] > 0
	if asked {
		if c.unsubs[channel]--; c.unsubs[channel] == 0 {
			delete(c.unsubs, channel)
		}
	}
	c.mu.Unlock()
	switch {
	case err != nil:
		c.fail(err)
	case !asked:
		c.fail(errUnasked)
	}
}

func (c *rueidisPush) confirm(channel string) {
	c.mu.Lock()
	c.queue = append(c.queue, channel)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// fail ends the listener with err, once.
func (c *rueidisPush) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.down)
	c.cancel()
}

// Unsubscribe sends UNSUBSCRIBE channel on the client's connection (the
// one its Receive sent SUBSCRIBE on, see pushable) and waits for its
// reply, which ends channel's Receive.
func (c *rueidisPush) Unsubscribe(ctx context.Context, channel string) error {
	c.mu.Lock()
	delete(c.subs, channel)
	c.unsubs[channel]++ // before it is sent: the reply may be read at once
	c.mu.Unlock()
	return c.client.Do(ctx, c.client.B().Unsubscribe().Channel(channel).Build()).Error()
}

func (c *rueidisPush) Confirmed() (string, error) {
	for {
		c.mu.Lock()
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return "", err
		}
		if len(c.queue) > 0 {
			ch := c.queue[0]
			c.queue = c.queue[1:]
			c.mu.Unlock()
			return ch, nil
		}
		c.mu.Unlock()
		select {
		case <-c.notify:
		case <-c.down:
		}
	}
}

// Close ends every Receive, then unsubscribes their channels: the
// connection is the client's, and stays, and a subscription left on it
// would count, for a release, a waiter nobody hears. (After a failure of the
// connection, the UNSUBSCRIBE goes to the client's new connection, where it
// does nothing.) Sent once no Receive is left to send a SUBSCRIBE after it.
func (c *rueidisPush) Close() {
	c.closer.Do(func() {
		c.fail(errHubDown)
		c.receives.Wait()
		c.mu.Lock()
		channels := make([]string, 0, len(c.subs))
		for ch := range c.subs {
			channels = append(channels, ch)
		}
		c.mu.Unlock()
		if len(channels) > 0 {
			// One round trip on a connection that works; bounded as the
			// Hub's own unsubscribing is.
			ctx, cancel := context.WithTimeout(context.Background(), hubLinger)
			c.client.Do(ctx, c.client.B().Unsubscribe().Channel(channels...).Build())
			cancel()
		}
	})
}
