// Package netlock provides mutual exclusion across processes and machines
// through Redis: a *NetMutex can replace a sync.Mutex, and the code keeps
// working, now excluding every process that locks the same name. NetRWMutex
// does the same for sync.RWMutex, and Semaphore for
// golang.org/x/sync/semaphore.Weighted; a MultiMutex locks several names at
// once, all or nothing. Election elects one leader among the processes that
// campaign under a name, as etcd's concurrency.Election does, and Once runs
// a function once across processes, as sync.Once does within one.
//
// The guides in the repository's docs directory go into depth: [usage],
// [clients], [leader election], [waiting and fairness], [quorum and
// fencing], [several names], [deployments], [observability], [the command],
// [evidence] and [speed].
//
// # sync.Locker and the context layer
//
// NetMutex satisfies sync.Locker. Lock blocks until the lock is held, however
// long the current holder keeps it; Unlock releases it; TryLock makes one
// attempt, like sync.Mutex.TryLock.
//
//	mu, err := netlock.New("balance:"+account, []netlock.Backend{goredis.New(rdb)})
//	...
//	mu.Lock()
//	balance := read()
//	write(balance - amount)
//	mu.Unlock()
//
// The context layer returns errors instead of panicking: LockCtx waits until
// ctx ends, TryLockCtx makes one attempt, UnlockCtx and ExtendCtx report a
// hold that was lost (ErrLockLost). Do runs a function under the lock, with
// a context that is cancelled if the hold is lost. Lock and TryLock panic
// when Redis cannot be asked (sync.Locker has no way to return an error),
// with the error LockCtx or TryLockCtx would return; Unlock panics only on
// misuse, as sync.Mutex does, never on what Redis does.
//
// A NetMutex is safe for concurrent use. Goroutines of one process that share
// it queue locally first, in order of arrival; only one of them at a time
// talks to Redis, and Unlock hands the hold to the next of them without a
// round trip, a bounded number of times in a row (WithLocalHandoffs). A
// Client, made once with the backends and options, gives the goroutines
// that ask it for one name the same lock object while it is in use:
//
//	locks, err := netlock.NewClient([]netlock.Backend{goredis.New(rdb)})
//	...
//	mu, err := locks.Mutex("balance:" + account)
//
// TryDo runs a function under the lock only if the lock is free right now
// ("skip if busy"): a process that tries while another runs it skips it,
// and one that tries after that run has returned runs it again. A job that
// must run once (a migration), or once per tick of a schedule (a Once per
// tick, named by the tick), is a Once: its Do runs the function unless it
// already ran to success, and the callers that come while it runs wait for
// it.
//
// ErrNotObtained means the lock was held by another when a call stopped; a
// wait that ended while Redis could not be asked matches ErrQuorum instead.
//
// # Holding a lock
//
// The lock is a Redis key, p{name} (p is the prefix, "netlock:" by default),
// set with a random value and a TTL, the expiry (8s by default). While the
// lock is held, a watchdog extends the key about every third of the expiry,
// so the lock does not expire while its process lives and does expire
// within the expiry if the process dies. Every hold also has a local
// deadline, measured on the monotonic clock; if it passes without a
// successful extend, the hold is lost at that moment by the local clock,
// whatever the network is doing: the channel from Lost is closed and Do's
// context is cancelled. Nothing ever re-acquires a lock that lapsed.
//
// netlock has at most 128 calls in flight per Backend, 64 of them kept for
// extends, so that a process holding many locks takes few connections and a
// crowd of acquires does not hold extends up. A call that finds none free
// waits for one, within its context.
//
// # Waiting
//
// A waiter's turn comes by a message from the release that makes it, in
// order of arrival, never by polling; over one Backend the release grants
// it the lock in the same script. Besides its turn, a waiter looks at the
// lock about once per expiry, in case the holder died. While Redis cannot
// be asked, a waiting LockCtx keeps trying for the outage window
// (WithOutageWindow, default the expiry), then reports each node's error.
// A Backend waits by message when it implements Subscriber, as those of
// NewRueidis, netlock/goredis and NewRedigo (on a pool that can dial) do.
//
// # Quorum
//
// New with several Backends, each an independent Redis deployment, makes a
// quorum lock in the manner of Redlock: held when a majority (len/2+1) of the
// nodes granted it with the same fencing token while time is left, the
// elapsed time and a clock-drift allowance taken off the expiry. A minority
// of nodes may be down, stalled or partitioned; a majority down gives
// ErrQuorum. A failed or cancelled acquire is released on every node, and a
// caller whose context ended never ends up holding the lock.
//
// # Fencing
//
// Token returns the hold's fencing token, which strictly increases with
// every acquisition of a lock name, over a quorum too. A lock alone cannot
// stop a holder that paused (a long GC, a stopped VM) past its expiry from
// writing after another took over; a resource that refuses writes with a
// token below the highest it has seen can.
//
// # Safety limits
//
// Clocks of clients and servers must tick at about the same rate (within
// the drift factor); they need not agree on the time of day. Redis must
// keep its data across a restart (appendonly yes, appendfsync always) or
// stay out of use for longer than the expiry after one, and must not evict
// keys (maxmemory-policy noeviction). Replication is asynchronous: a
// failover can lose a lock, unless the lock is a quorum over independent
// deployments or WithSyncReplicas waits for replicas to acknowledge it.
//
// # Clients, logs and metrics
//
// NewRedigo, NewRueidis and netlock/goredis make Backends of the three Go
// Redis clients; a Backend of your own needs one method, Eval. A NetMutex
// logs with log/slog (WithLogger), tells an Observer of its acquires,
// unlocks, extends and lost holds (WithObserver; netlock/otelnetlock turns
// them into OpenTelemetry metrics and spans), and Inspect tells whether a
// lock is held, by whom, by which token and for how long, without taking
// it (NetRWMutex.Inspect and Semaphore.Inspect, likewise).
//
// # Testing
//
// Package netlock/netlocktest runs locks on an in-process miniredis whose
// time, and the locks' own, moves when a test says so: a holder's expiry,
// a waiter's turn, a watchdog's extends and Lost take no real time. See
// [testing].
//
// [usage]: https://github.com/netlock-go/netlock/blob/main/docs/usage.md
// [clients]: https://github.com/netlock-go/netlock/blob/main/docs/clients.md
// [leader election]: https://github.com/netlock-go/netlock/blob/main/docs/election.md
// [waiting and fairness]: https://github.com/netlock-go/netlock/blob/main/docs/waiting.md
// [quorum and fencing]: https://github.com/netlock-go/netlock/blob/main/docs/quorum.md
// [several names]: https://github.com/netlock-go/netlock/blob/main/docs/multi.md
// [deployments]: https://github.com/netlock-go/netlock/blob/main/docs/deployments.md
// [observability]: https://github.com/netlock-go/netlock/blob/main/docs/observability.md
// [the command]: https://github.com/netlock-go/netlock/blob/main/docs/command.md
// [evidence]: https://github.com/netlock-go/netlock/blob/main/docs/evidence.md
// [speed]: https://github.com/netlock-go/netlock/blob/main/docs/speed.md
// [testing]: https://github.com/netlock-go/netlock/blob/main/docs/testing.md
package netlock
