package goredis

import (
	"context"
	"errors"
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
)

// listen is the Hub's HubConfig.Listen. It makes a *redis.PubSub without
// channels: go-redis dials its connection on the first Subscribe, which the
// Hub sends right away with the same ctx, so ctx bounds the dial.
func (b *backend) listen(ctx context.Context, onMessage func(channel, payload string)) (netlock.Listener, error) {
	ps := b.client.Subscribe(ctx)
	if ps == nil {
		return nil, errors.New("netlock/goredis: the client's Subscribe returned no PubSub")
	}
	return &listener{
		ps:        ps,
		onMessage: onMessage,
		sent:      make(chan struct{}),
		closed:    make(chan struct{}),
		pending:   make(map[string]int),
	}, nil
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
type listener struct {
	ps        *redis.PubSub
	onMessage func(channel, payload string)

	sent     chan struct{} // closed when a first SUBSCRIBE was sent: the connection exists
	sentOnce sync.Once
	closed   chan struct{}
	closer   sync.Once

	mu sync.Mutex
	// pending counts, per channel, the SUBSCRIBEs sent whose confirmation
	// has not come yet. The server confirms each once, in order.
	pending map[string]int
}

// Subscribe sends SUBSCRIBE channel, dialing the connection if it is the
// first; ctx bounds the dial and the write.
func (l *listener) Subscribe(ctx context.Context, channel string) error {
	// Counted before it is sent: the confirmation may be read at once.
	l.mu.Lock()
	l.pending[channel]++
	l.mu.Unlock()
	if err := l.ps.Subscribe(ctx, channel); err != nil {
		return err // the Hub closes the listener
	}
	l.sentOnce.Do(func() { close(l.sent) })
	return nil
}

// Unsubscribe sends UNSUBSCRIBE channel.
func (l *listener) Unsubscribe(ctx context.Context, channel string) error {
	return l.ps.Unsubscribe(ctx, channel)
}

// Confirmed reads the connection until the server confirms a SUBSCRIBE,
// passing every message on to the Hub meanwhile, and returns its channel.
// It returns an error when the connection fails, is replaced or is closed.
func (l *listener) Confirmed() (string, error) {
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
			if m.Kind != "subscribe" {
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

// Close closes the connection and makes Confirmed return an error. It may
// be called more than once.
func (l *listener) Close() {
	l.closer.Do(func() {
		close(l.closed)
		l.ps.Close()
	})
}
