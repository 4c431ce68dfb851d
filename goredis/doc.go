// Package goredis provides a netlock Backend on go-redis v9
// (github.com/redis/go-redis/v9), for programs that already talk to Redis
// through it:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	m, err := netlock.New("report", []netlock.Backend{goredis.New(rdb)})
//
// The Backend is what netlock's built-in ones are: it runs netlock's scripts
// (EVALSHA, EVAL when the server has lost them), its waiters wait by message
// in the lock's queue of waiters, on one pub/sub connection shared by all
// of them, and it tells netlock which errors are final. It is built only on
// netlock's exported API (Backend, Subscriber, Hub, Listener,
// ErrorClassifier), the way a Backend for another client library would be.
//
// # Clients
//
// New takes a redis.UniversalClient:
//
//   - *redis.Client, from redis.NewClient: one server;
//   - *redis.Client, from redis.NewFailoverClient: the primary that Redis
//     Sentinel names, followed across failovers by go-redis;
//   - *redis.ClusterClient, from redis.NewClusterClient (or
//     NewFailoverClusterClient): a Redis Cluster. All keys of one lock share
//     a hash slot, so every script runs on one node and never fails with
//     CROSSSLOT.
//
// A *redis.Ring is refused (see New): it is not one deployment but several
// independent servers, and it moves a key to another server when the one
// that had it stops answering its health checks, so that two processes
// could hold one lock. Independent servers are what a quorum is for: give
// netlock.New one Backend per server.
//
// # Pipelining
//
// On a *redis.Client, the script calls of goroutines that run at once are
// pipelined: a call alone is one EVALSHA on a connection of the client's
// pool; calls made while another is in flight queue, and one goroutine at
// a time sends the queue as one pipeline (Client.Pipelined), again while
// calls queued meanwhile. A queued call returns when its context ends; its
// command is sent and its reply dropped. A pipeline carries the context
// values of its first call (a tracing hook sees it under that call) and
// the latest deadline of its calls. A *redis.ClusterClient runs each call
// on its own.
//
// # Timeouts
//
// netlock bounds every call to Redis with a context deadline, the node
// timeout (see netlock.WithNodeTimeout). go-redis applies a context's
// deadline to the socket only when Options.ContextTimeoutEnabled is set;
// set it. Without it, Eval still returns when its context ends, but the
// command goes on, on a goroutine of its own, until the server answers or
// the client's ReadTimeout passes.
//
// go-redis dials a new connection on a goroutine of its own and retries a
// failed dial (Options.DialerRetries, 5 by default, 100ms apart), and a
// command waits for it until its deadline. So a server that refuses
// connections shows as a node timeout, where netlock's own Backends see the
// refusal at once: a LockCtx rides it out the same, but a TryLockCtx takes
// the node timeout to fail. A client with DialerRetries 1 and MaxRetries -1
// reports the refusal at once (netlock retries by itself), for everything
// it runs.
//
// # Waiting
//
// While waiters of a Backend wait for a lock, it keeps one pub/sub
// connection of the client (redis.UniversalClient.Subscribe) subscribed to
// their release channels, and closes it shortly after the last wait ends.
// go-redis reconnects a pub/sub connection by itself when it fails; a
// release published meanwhile would be lost, so the Backend tells netlock
// of every failure instead of letting go-redis hide it: netlock then opens
// a new connection and every waiter looks at the lock again.
//
// On a Redis Cluster (7.0 or later) the waiters use sharded pub/sub: a
// release publishes with SPUBLISH, which only the nodes of the lock's shard
// hear (PUBLISH would be relayed to every node of the cluster), and the
// Backend keeps one connection per master whose slots have waiters, opened
// with that master's SSubscribe (the master being the client's
// MasterForKey of the channel, which shares the lock key's hash tag). Each
// channel it confirms is checked to be served by that node as master (an
// EXISTS, which a replica answers with MOVED), so that SPUBLISH counts its
// waiters, and a release can grant the head waiter the lock in its script
// and skip a waiter that died. A connection that fails, is refused
// (MOVED), or loses its subscriptions because their slot moved (Redis
// unsubscribes them, as in a failover) wakes its waiters, which watch
// again on the master the client names then (the client is asked to
// reload its slot map) and look at the lock. On an older cluster, without
// sharded pub/sub, the waiters poll.
package goredis
