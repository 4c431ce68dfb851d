package netlock

import "context"

// What a Backend can offer besides Eval. Each is an optional interface,
// found by type assertion like io.WriterTo; NewRedigo, NewRueidis and
// netlock/goredis implement both. A Backend that wraps another (to count or
// log its calls, say) should implement the ones its inner Backend does, by
// forwarding to it, or its waiters lose what they give.

// A Subscriber is a Backend whose waiters wait by message. With it, a
// waiter listens on a channel of its own, joins the lock's queue of waiters
// (turns go in order of arrival, across processes), and sleeps until the
// release that makes it the head of that queue tells it so; over one
// deployment the release grants it the lock in the same script. A waiter
// costs Redis about one command per expiry, and a dead waiter is skipped.
// (On a Redis Cluster, granting and skipping need sharded pub/sub: see
// HubConfig.)
//
// A Backend that is not a Subscriber still works: its waiters poll, with
// the jittered delays of WithRetryDelay bounded by the holder's remaining
// TTL, and take no place in the queue, so turns are not in order of
// arrival.
type Subscriber interface {
	Backend
	// Hub returns the Backend's Hub, made once by NewHub: the same Hub from
	// every call. A nil Hub means the Backend cannot listen now; its
	// waiters poll.
	Hub() *Hub
}

// HubConfig says how a Hub reaches its Backend's server.
//
// A Backend of a single server, or of a primary with replicas, sets Listen.
// A Backend of a Redis Cluster (7.0 or later) that can reach each of the
// cluster's masters sets Shard and ListenShard instead: its waiters then
// wait by sharded pub/sub, the releases run on a master publish with
// SPUBLISH, which only the nodes of that master's shard hear, and the Hub
// keeps one connection per master. A Cluster Backend that cannot (Listen
// and Cluster) still works, with PUBLISH, which the cluster relays to every
// node.
type HubConfig struct {
	// Listen opens a new pub/sub connection to the server, or the same
	// deployment, the Backend's Eval reaches. Every message the connection
	// receives must be passed to onMessage, in the order received, from the
	// goroutine that reads it (onMessage does no I/O and returns at once).
	// ctx bounds the dial. Required unless Shard is set; unused if it is.
	Listen func(ctx context.Context, onMessage func(channel, payload string)) (Listener, error)

	// Cluster says the Backend is a Redis Cluster whose Hub listens with
	// Listen. There PUBLISH counts only the subscribers connected to the
	// node it runs on, so a release cannot tell a waiter nobody listens
	// for: it tells the head of the queue to attempt instead of granting it
	// the lock, and a waiter whose process died keeps its place until its
	// entry expires. Shard makes it unneeded.
	Cluster bool

	// Shard, for a Redis Cluster, returns the address of the master that
	// serves channel's hash slot now (the channel shares the lock key's
	// hash tag, so the slot of the lock's scripts), as ListenShard takes
	// it. It should answer from the client's slot map; when the Backend
	// learns that the map is stale (a Listener of ListenShard failed), it
	// may refresh it here, bounded by ctx. A wrong answer costs a failed
	// subscription (ListenShard's Listener reports it), never a lost
	// release. Setting Shard makes the Hub sharded; ListenShard is then
	// required.
	Shard func(ctx context.Context, channel string) (node string, err error)

	// ListenShard opens a new pub/sub connection to node, an address
	// returned by Shard, on which the Listener subscribes with SSUBSCRIBE
	// and unsubscribes with SUNSUBSCRIBE. Messages are passed to onMessage
	// as with Listen. ctx bounds the dial.
	//
	// Its Listener's Confirmed must return a channel only once node has
	// shown, after confirming the SSUBSCRIBE, that it is the master serving
	// the channel's slot: a command on the channel's slot that a replica
	// refuses, such as EXISTS channel, sent after the confirmation (on the
	// same connection, or another to node), did not answer MOVED. A replica
	// accepts SSUBSCRIBE and hears what its master publishes, but the
	// master's SPUBLISH does not count it, and a release that counts
	// nobody gives the turn, and the lock, to the next waiter. Confirmed
	// must fail, as for a lost connection, when the server answers an
	// SSUBSCRIBE with an error (MOVED: node does not serve the slot) or
	// unsubscribes a channel the Hub did not unsubscribe (Redis sends
	// sunsubscribe when the slot leaves the node, as in a failover). The
	// Hub then wakes that connection's waiters, which watch again on the
	// master Shard names and attempt.
	ListenShard func(ctx context.Context, node string, onMessage func(channel, payload string)) (Listener, error)
}

// A Listener is one pub/sub connection of a Hub, opened by HubConfig.Listen
// or HubConfig.ListenShard. The Hub calls Confirmed from one goroutine;
// Subscribe, Unsubscribe and Close may be called meanwhile, from others, but
// never two of them at once.
//
// A Listener should not outlive the Backend's client: once the client is
// closed, its connection should be closed too, and Confirmed fail, as
// go-redis does to its PubSub connections. A release that still counts a
// Listener of a closed client grants the lock to a waiter that can neither
// extend nor release it, and the next waiter waits for the grant to expire.
// (The Backends of NewRedigo, and of NewRueidis where it listens on a
// dedicated connection, whose clients leave such connections open, find
// the closed client when a grant comes, and pass the grant on.)
type Listener interface {
	// Subscribe sends SUBSCRIBE channel (SSUBSCRIBE, for ListenShard). It
	// need not wait for the server's confirmation: Confirmed returns it.
	Subscribe(ctx context.Context, channel string) error
	// Unsubscribe sends UNSUBSCRIBE channel (SUNSUBSCRIBE, for
	// ListenShard), without waiting for the server's confirmation.
	Unsubscribe(ctx context.Context, channel string) error
	// Confirmed blocks until the server confirms a SUBSCRIBE and returns
	// its channel; the server confirms them in the order they were sent.
	// Confirmations of UNSUBSCRIBE are dropped. Once the connection fails
	// or is closed, Confirmed returns an error, and the Hub stops using the
	// Listener. (For ListenShard, see there what more it checks.)
	Confirmed() (channel string, err error)
	// Close closes the connection, dropping its subscriptions, and makes
	// Confirmed return an error. It may be called more than once.
	Close()
}

// An ErrorClassifier is a Backend that can tell which of its errors are
// final. Without it, netlock takes every error for one that may have left
// the call in flight: a release is delivered again in the background until
// ten expiries have passed, and a waiter rides out even an
// error reply like WRONGTYPE for the outage window (WithOutageWindow) before
// it reports it.
type ErrorClassifier interface {
	// Final reports whether err, returned by Eval, is final: the server
	// answered with an error reply (it ran or refused the script: nothing
	// of the call is still in flight), or the client is closed (nothing
	// sent through it can be delivered any more). A connection refused is
	// final whatever Final says.
	Final(err error) bool
}
