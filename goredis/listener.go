package goredis

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
)

var (
	// errClosed is Confirmed's error once the listener is closed.
	errClosed = errors.New("netlock/goredis: pub/sub connection closed")
	// errReplaced is Confirmed's error when go-redis confirms a subscription
	// that this listener did not send: it has replaced the connection by
	// itself and subscribed the new one to the old one's channels.
	errReplaced = errors.New("netlock/goredis: pub/sub connection replaced by go-redis")
	// errUnsubscribed is Confirmed's error when a master unsubscribed a
	// channel by itself: its hash slot left the node.
	errUnsubscribed = errors.New("netlock/goredis: the server unsubscribed a channel (its hash slot moved)")
)

// listen is the Hub's HubConfig.Listen. It makes a *redis.PubSub without
// channels: go-redis dials its connection on the first Subscribe, which the
// Hub sends right away with the same ctx, so ctx bounds the dial.
func (b *backend) listen(ctx context.Context, onMessage func(channel, payload string)) (netlock.Listener, error) {
	ps := b.client.Subscribe(ctx)
	if ps == nil {
		return nil, errors.New("netlock/goredis: the client's Subscribe returned no PubSub")
	}
	return newListener(ps, onMessage, nil), nil
}

// shard is the Hub's HubConfig.Shard for a *redis.ClusterClient: the
// address of the master of channel's slot, from the client's slot map
// (MasterForKey, which loads it if it has none, bounded by ctx).
func (b *backend) shard(ctx context.Context, channel string) (string, error) {
	c, err := b.cluster.MasterForKey(ctx, channel)
	if err != nil {
		return "", fmt.Errorf("netlock/goredis: master of channel %s: %w", channel, err)
	}
	addr := c.Options().Addr
	b.mastersMu.Lock()
	b.masters[addr] = c
	b.mastersMu.Unlock()
	return addr, nil
}

// listenShard is the Hub's HubConfig.ListenShard: a *redis.PubSub of node's
// client (SSubscribe), dialed on the first SSUBSCRIBE as listen's is.
func (b *backend) listenShard(ctx context.Context, node string, onMessage func(channel, payload string)) (netlock.Listener, error) {
	b.mastersMu.Lock()
	c := b.masters[node]
	b.mastersMu.Unlock()
	if c == nil {
		return nil, fmt.Errorf("netlock/goredis: cluster master %s unknown", node)
	}
	ps := c.SSubscribe(ctx)
	if ps == nil {
		return nil, errors.New("netlock/goredis: the master's SSubscribe returned no PubSub")
	}
	return newListener(ps, onMessage, &shardCheck{master: c, failed: func() { b.cluster.ReloadState(context.Background()) }}), nil
}

func newListener(ps *redis.PubSub, onMessage func(channel, payload string), shard *shardCheck) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{
		ctx:       ctx,
		cancel:    cancel,
		ps:        ps,
		onMessage: onMessage,
		shard:     shard,
		sent:      make(chan struct{}),
		closed:    make(chan struct{}),
		pending:   make(map[string]int),
		unsubs:    make(map[string]int),
	}
}

// A shardCheck is what a listener of a Redis Cluster master needs besides
// its PubSub.
type shardCheck struct {
	// master is the client of the listener's node, for the check that it
	// serves a confirmed channel's slot as master.
	master *redis.Client
	// failed is called when the listener fails: the slot map may be stale.
	failed func()
}

// A listener is one pub/sub connection of a Hub: a *redis.PubSub.
//
// The Hub calls Confirmed from its reading goroutine while it calls
// Subscribe, Unsubscribe and Close from others, one at a time. PubSub allows
// that: its Subscribe and Unsubscribe write under its own lock, and its
// Receive reads without it (as PubSub.Channel's goroutine does while its
// user subscribes).
//
// go-redis's PubSub replaces a failed connection by itself: Receive, having
// read an error, dials a new connection and subscribes it to every channel
// before it returns the error. netlock must hear of the failure (a release
// published in between is lost), so Confirmed returns every error, and the
// Hub closes the listener, new connection and all. A replacement made
// without an error (go-redis follows a server's maintenance notifications
// so) shows only as confirmations of channels already confirmed; Confirmed
// fails on those too.
//
// A listener of a Cluster's master (shard set) subscribes with SSUBSCRIBE,
// and checks each confirmed channel as netlock.HubConfig.ListenShard asks:
// with EXISTS channel, on another connection of the master's client, sent
// once the confirmation was read (so run after the SSUBSCRIBE), which a
// replica answers with MOVED.
type listener struct {
	ps        *redis.PubSub
	onMessage func(channel, payload string)
	shard     *shardCheck // nil unless the listener is a Cluster master's

	sent     chan struct{} // closed when a first SUBSCRIBE was sent: the connection exists
	sentOnce sync.Once
	closed   chan struct{}
	closer   sync.Once
	// ctx ends with Close: it bounds the check of a Cluster's master.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// pending counts, per channel, the SUBSCRIBEs sent whose confirmation
	// has not come yet. The server confirms each once, in order.
	pending map[string]int
	// unsubs counts, per channel, the SUNSUBSCRIBEs sent whose
	// confirmation has not come yet: any other sunsubscribe is the
	// server's own.
	unsubs map[string]int
}

// Subscribe sends SUBSCRIBE channel, dialing the connection if it is the
// first; ctx bounds the dial and the write.
func (l *listener) Subscribe(ctx context.Context, channel string) error {
	// Counted before it is sent: the confirmation may be read at once.
	l.mu.Lock()
	l.pending[channel]++
	l.mu.Unlock()
	subscribe := l.ps.Subscribe
	if l.shard != nil {
		subscribe = l.ps.SSubscribe
	}
	if err := subscribe(ctx, channel); err != nil {
		return err // the Hub closes the listener
	}
	l.sentOnce.Do(func() { close(l.sent) })
	return nil
}

// Unsubscribe sends UNSUBSCRIBE channel (SUNSUBSCRIBE to a Cluster's
// master).
func (l *listener) Unsubscribe(ctx context.Context, channel string) error {
	if l.shard == nil {
		return l.ps.Unsubscribe(ctx, channel)
	}
	l.mu.Lock()
	l.unsubs[channel]++ // before it is sent: the reply may be read at once
	l.mu.Unlock()
	return l.ps.SUnsubscribe(ctx, channel)
}

// Confirmed reads the connection until the server confirms a SUBSCRIBE,
// passing every message on to the Hub meanwhile, and returns its channel.
// It returns an error when the connection fails, is replaced or is closed;
// for a Cluster's master, also when the server refuses an SSUBSCRIBE
// (MOVED), unsubscribes a channel by itself, or fails the check that it
// is the master of a confirmed channel's slot.
func (l *listener) Confirmed() (string, error) {
	ch, err := l.confirmed()
	if l.shard == nil {
		return ch, err
	}
	if err == nil {
		// No deadline but Close: a master that does not answer fails the
		// connection too.
		err = l.shard.master.Exists(l.ctx, ch).Err()
	}
	if err != nil {
		select {
		case <-l.closed:
		default:
			l.shard.failed()
		}
	}
	return ch, err
}

func (l *listener) confirmed() (string, error) {
	// Before the first SUBSCRIBE there is no connection, and Receive would
	// dial one itself, unbounded by any caller's ctx.
	select {
	case <-l.sent:
	case <-l.closed:
		return "", errClosed
	}
	for {
		// No deadline: the connection idles while the lock is held, however
		// long that is. Close ends the wait.
		msg, err := l.ps.Receive(context.Background())
		if err != nil {
			return "", err
		}
		switch m := msg.(type) {
		case *redis.Message:
			l.onMessage(m.Channel, m.Payload)
		case *redis.Subscription:
			if m.Kind == "sunsubscribe" && !l.asked(m.Channel) {
				return "", fmt.Errorf("%w: %s", errUnsubscribed, m.Channel)
			}
			if m.Kind != "subscribe" && m.Kind != "ssubscribe" {
				continue // an UNSUBSCRIBE's confirmation
			}
			l.mu.Lock()
			n := l.pending[m.Channel]
			switch n {
			case 0:
				l.mu.Unlock()
				return "", errReplaced
			case 1:
				delete(l.pending, m.Channel)
			default:
				l.pending[m.Channel] = n - 1
			}
			l.mu.Unlock()
			return m.Channel, nil
		}
	}
}

// asked reports whether an sunsubscribe of channel answers an SUNSUBSCRIBE
// of ours, and counts it.
func (l *listener) asked(channel string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch n := l.unsubs[channel]; n {
	case 0:
		return false
	case 1:
		delete(l.unsubs, channel)
	default:
		l.unsubs[channel] = n - 1
	}
	return true
}

// Close closes the connection and makes Confirmed return an error. It may
// be called more than once.
func (l *listener) Close() {
	l.closer.Do(func() {
		close(l.closed)
		l.cancel()
		l.ps.Close()
	})
}
