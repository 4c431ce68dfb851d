// Package netlock provides a mutual exclusion lock shared across processes
// and machines through Redis: a *NetMutex can replace a sync.Mutex, and the
// code keeps working, now excluding across the network.
//
// # sync.Locker and the context layer
//
// NetMutex satisfies sync.Locker. Lock blocks until the lock is held, however
// long the current holder keeps it; Unlock releases it. TryLock makes one
// attempt and reports whether it succeeded, like sync.Mutex.TryLock.
//
//	mu, err := netlock.New("balance:"+account, []netlock.Backend{netlock.NewRedigo(pool)})
//	...
//	mu.Lock()
//	balance := read()
//	write(balance - amount)
//	mu.Unlock()
//
// The context layer returns errors instead: LockCtx waits until ctx ends,
// TryLockCtx makes one attempt, UnlockCtx and ExtendCtx report a hold that
// was lost (ErrLockLost). Do runs a function under the lock, with a context
// that is cancelled if the hold is lost.
//
// When each method panics, exactly:
//   - Lock and TryLock panic when Redis cannot be asked (after the outage
//     window, for Lock), since sync.Locker has no way to return an error,
//     as etcd's concurrency.NewLocker does; the panic value is the error
//     LockCtx or TryLockCtx would return.
//   - Unlock panics only on misuse, as sync.Mutex does: the NetMutex is not
//     locked (the value matches ErrNotHeld). A hold that was lost, or a
//     release Redis did not take, is logged at Warn and returns; a release
//     that could not be delivered is delivered in the background.
//   - Lock, TryLock and Unlock also panic on a NetMutex not made by New,
//     with an error saying so.
//   - The ctx methods and Do never panic (Do lets a panic of its function
//     go on, after unlocking): they return the error.
//
// Goroutines of one process that share a NetMutex queue locally first, in
// order of arrival, and only one of them at a time talks to Redis. A
// NetMutex is safe for concurrent use; Unlock may come from a goroutine
// other than the one that locked.
//
// # Readers and writers
//
// NetRWMutex (NewRW) is sync.RWMutex across processes: any number of
// readers or one writer among every client of the name, a waiting writer
// keeping new readers out, readers that waited behind a writer getting in
// before a writer that came after them. The readers of one process share
// one read lease in Redis. Its ctx layer, errors and panics are NetMutex's;
// RLost is the read lease's Lost.
//
// # Bounded concurrency
//
// Semaphore (NewSemaphore) is golang.org/x/sync/semaphore.Weighted across
// processes: at most size permits out among every client of the name,
// weighted, waiters served in order of arrival. The permits of one process
// are held on one lease in Redis, extended while it lives; Lost tells when
// it lapsed. It runs on one Backend (a server or a Cluster), not on a
// quorum: majorities intersect pairwise, which bounds one holder, not k.
//
// # Waiting
//
// An uncontended Lock and Unlock are one round trip each. A LockCtx that
// finds the lock held subscribes to its own release channel (one pub/sub
// connection per Backend, shared by all its waiters; on a Redis Cluster, one
// per master, with sharded pub/sub: see HubConfig), attempts once more,
// which puts it in the lock's queue of waiters in Redis, and sleeps. Its turn
// comes by message, never by polling: the release takes the longest waiter
// off the queue and, over one node, sets the lock key for it in the same
// script and tells it so, so that it holds without a round trip (over a
// quorum it is told to attempt). A waiter nobody listens for any more (its
// process died) is skipped. Besides its turn, a waiter wakes only when its
// pub/sub connection fails (it subscribes and attempts again), when the
// holder's TTL runs out (a holder that dies releases nothing), or when ctx
// ends: about one look at the lock per expiry, a fraction of a Redis command
// per waiter-second. A waiter that gives up passes on a turn given to it.
//
// While Redis cannot be asked (refused, reset, restarting, slower than the
// node timeout), LockCtx and Lock keep trying for the outage window
// (WithOutageWindow, default the expiry), then report the nodes' errors; a
// restart of a few hundred milliseconds costs a waiter nothing.
//
// An Unlock whose release woke another client to attempt makes the next
// acquire of the same NetMutex wait a moment, so that the woken one gets its
// turn. While goroutines of the process wait on the same NetMutex, Unlock
// hands the hold to the first of them without a round trip, a bounded number
// of times in a row (WithLocalHandoffs); the hold keeps its fencing token.
//
// # Holding a lock
//
// The lock is a Redis key, p{name} (p is the prefix, "netlock:" by default),
// set with a random value and a TTL, the expiry (8s by default). While a
// NetMutex is held, a watchdog extends the key about every third of the
// expiry, so the lock does not expire while its process lives, and does
// expire within the expiry if the process dies. Each extend falls at random
// in the last quarter before the third is up, so that the extends of locks
// taken together spread out instead of coming in bursts.
//
// A process may hold many locks at once (ten thousand is measured): netlock
// has at most 128 calls in flight per Backend, 64 of them kept for extends,
// so that on a pool without a bound of its own (redigo's MaxActive 0) they
// take few connections, and a crowd of acquires does not hold extends up.
// A call that finds no slot free waits for one, within its context (an
// extend, within its hold's deadline); the node timeout bounds it once sent.
//
// Every hold has a local deadline, measured on the monotonic clock from
// before the acquire was sent, less a clock-drift allowance. If the deadline
// passes without a successful extend (Redis down, partitioned, the key
// deleted or taken), the hold is lost at that moment by the local clock,
// whatever the network is doing: the channel from Lost is closed, Do's
// context is cancelled, and UnlockCtx and ExtendCtx return ErrLockLost.
// Nothing ever re-acquires a lock that lapsed.
//
// # Quorum
//
// New with several backends, each an independent Redis deployment (a single
// server, a primary with replicas, or a Redis Cluster), makes a quorum lock
// in the manner of Redlock: the acquire is sent to all nodes in parallel,
// each call bounded by the node timeout, and the lock is held when a
// majority (len/2+1) granted it with the same fencing token while time is
// left: validity = expiry - elapsed - (expiry*drift + 2ms), with elapsed
// measured on the monotonic clock from before anything was sent. Extend and
// release also need a majority. Any majority of nodes survives the loss or
// stall of the others; a majority down gives ErrQuorum, naming each failed
// node, within the node timeout.
//
// A failed or cancelled acquire releases on every node that may hold its
// value, under a context the caller's cancellation does not reach; nodes
// that cannot be asked get the release again later from a small per-NetMutex
// goroutine. A release that does not find its value leaves a tombstone, so an
// acquire still on its way to a stalled node is refused when it arrives. A
// caller whose context ended never ends up holding the lock.
//
// # Fencing
//
// Token returns the hold's fencing token, which strictly increases with
// every acquisition of a lock name. A lock alone cannot stop a holder that
// paused (a long GC, a stopped VM) past its expiry from writing after another
// holder took over; a resource that remembers the highest token it has seen
// and refuses writes with a lower one can. Counters are kept per Redis
// Cluster hash slot, not per name, so locking millions of distinct names
// leaves at most 16384 counter keys.
//
// Over a quorum, tokens come from a ballot: the client proposes one above
// the highest counter it has seen; a node grants only if the lock key is
// absent and the proposal is above its counter, which it then takes; a
// refusal teaches the client the higher counter. A hold needs a majority
// granting the same token. Any two majorities share a node, and every node
// accepts only increasing tokens, so tokens are unique and increase in the
// order holds were acquired, as long as the counters survive: run Redis with
// appendonly yes and appendfsync always, or re-seed a node that lost its
// data (set its counters to the highest of the others') before it rejoins.
//
// # Safety limits
//
// A lock on Redis is only as safe as its assumptions. Clocks: the hold's
// local deadline and the server's TTL both measure time; they must run at
// about the same rate (within the drift factor, 1% by default). They need
// not agree on the time of day: TTLs are always relative. Persistence: if
// Redis restarts without its data (no AOF, or AOF without fsync), a lock it
// held is forgotten and the fence counter may go back; run Redis with
// appendonly yes and appendfsync always, or keep a restarted server out of
// use for longer than the expiry. Replication is asynchronous: a replica
// promoted after a failover may not have the lock; a quorum of independent
// deployments does not depend on replication, and WithSyncReplicas makes
// every acquire and extend wait until n replicas acknowledged it (Redis's
// WAIT), so that a failover to one of those keeps the lock.
//
// Errors name the node they came from ("netlock: node 0: ..."). Failures to
// reach Redis match ErrQuorum; contention matches ErrNotObtained, and so does
// a context that ended while waiting, together with the context's error.
//
// # Clients, logs and metrics
//
// NewRedigo, NewRueidis and netlock/goredis make Backends of the three Go
// Redis clients; a Backend of your own needs one method, Eval, and waits by
// message if it also implements Subscriber (see there).
//
// A NetMutex logs with log/slog (WithLogger): at Warn, a hold lost, a
// release not delivered to every node, and the reaper giving up; at Debug,
// every acquire, unlock and extend. Without WithLogger, Warn and above go to
// slog.Default(). WithObserver gives every acquire, unlock, extend and lost
// hold to functions of yours; netlock/otelnetlock turns them into
// OpenTelemetry metrics and spans. Inspect tells whether a lock is held, by
// which token, and for how long, without taking it.
package netlock
