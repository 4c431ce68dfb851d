package main

import (
	"context"
	"fmt"
	"time"
)

// Sizes of the scenarios.
const (
	contendingClients = 8
	sharingGoroutines = 8
	quorumServers     = 5
)

var independentKeys = []int{8, 64}

type shape int

const (
	shapeOps       shape = iota // independent operations: ops/s, p50, p99
	shapeContended              // workers on one lock: critical sections/s, holder changes
	shapeWaiting                // waiters behind a holder: Redis commands per waiter-second, once per row
	shapeHolds                  // one process holding many locks: lost holds, connections, extends/s, once per row
	shapeRW                     // readers and writers on one NetRWMutex (or NetMutex): reads/s, writes/s, commands per section
	shapeSem                    // goroutines of several processes on one Semaphore (or NetMutexes): acquisitions/s, fairness
	shapeMulti                  // processes each taking several names (MultiMutex, or NetMutexes in order): sets/s
	shapeElect                  // processes campaigning for one Election (or one NetMutex): hand-overs
	shapeOnce                   // a Once: Do of a name done, and stampedes of processes on one name
)

// waitingID is the waiting scenario's id.
var waitingID = fmt.Sprintf("waiting%d", waitingClients)

// A scenario is one table of the report: rows measured side by side.
type scenario struct {
	id    string // for -only and the summary
	title string
	what  string // how it is measured, for the report
	shape shape
	rows  []*row
	// strict: its rows measure netlock only, so an overlap or a lost
	// update is a failure of netlock: the run ends with an error.
	strict bool
	// costOn, for a scenario on one server: the server whose command time
	// (INFO commandstats) each row's rounds are charged, with the
	// allocations of the bench process, per operation.
	costOn string
}

// A row is one contender (or one floor operation) in a scenario.
type row struct {
	name string
	c    *contender // nil for a PING row
	na   string     // why the contender cannot run this scenario
	note string     // how it was set up here, if the scenario needs saying
	// setup connects; the phase it returns runs one measured round on fresh
	// lock names.
	setup    func() (phase func(ctx context.Context, dur time.Duration, round int) result, cleanup func(), err error)
	setupErr error
	res      result
}

func buildScenarios(cs []contender, addrs []string) []*scenario {
	one := addrs[:1]
	var floor, uncontended, clients, shared, quorum, waiting, holds, rwread, rwwaiting, sem, semwaiting scenario
	keys := make([]scenario, len(independentKeys))

	floor = scenario{
		id: "floor", title: "1. Floor: one client, one server",
		what:   "PING, and the hand-written lock cycle (SET NX PX, then EVALSHA compare-and-delete), one goroutine in a loop. Latency is per PING or per whole cycle. Server µs/op and allocs/op as in scenario 2.",
		shape:  shapeOps,
		costOn: one[0],
	}
	floor.rows = append(floor.rows,
		&row{name: "PING/redigo", setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
			p := newRedigoPool(one[0])
			ping := redigoPinger(p)
			return func(ctx context.Context, dur time.Duration, _ int) result {
				return runOps(ctx, dur, []func(context.Context) error{ping})
			}, func() { p.Close() }, nil
		}},
		&row{name: "PING/goredis", setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
			c := newGoredis(one[0])
			ping := goredisPinger(c)
			return func(ctx context.Context, dur time.Duration, _ int) result {
				return runOps(ctx, dur, []func(context.Context) error{ping})
			}, func() { c.Close() }, nil
		}},
		&row{name: "PING/rueidis", setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
			c, err := newRueidis(one[0])
			if err != nil {
				return nil, nil, err
			}
			ping := rueidisPinger(c)
			return func(ctx context.Context, dur time.Duration, _ int) result {
				return runOps(ctx, dur, []func(context.Context) error{ping})
			}, c.Close, nil
		}},
	)

	uncontended = scenario{
		id: "uncontended", title: "2. Uncontended lock + unlock: one client, one goroutine",
		what: "One goroutine locks and unlocks one lock in a loop. Latency is per lock + unlock pair. The hand-written rows are the floor, not libraries. " +
			"Server µs/op: the server time of the commands the row ran (`INFO commandstats` usec around each round, bench's INFO left out) per lock + unlock; allocs/op: heap allocations of the bench process (`runtime.MemStats.Mallocs` around each round, the harness's own included, the same for every row) per lock + unlock.",
		shape:  shapeOps,
		costOn: one[0],
	}
	clients = scenario{
		id: "clients8", title: fmt.Sprintf("3. %d clients on one lock", contendingClients),
		what: fmt.Sprintf("%d clients, each its own client object and connections (like separate processes), each looping lock → critical section → unlock on one lock. "+
			"CS/s: critical sections per second. Holder change: from unlock returning in one client to lock returning in a *different* client (negative when the new holder's lock returned before the old holder's unlock call did). "+
			"Self-reacquire: acquisitions by the client that held the lock just before. Fairness: fewest/most acquisitions of one client. "+
			"Gave up: lock calls that returned without the lock (retries exhausted, or no retry); the client then calls again at once. "+
			"Overlaps: entries into a critical section another client was in; lost: counter updates lost to overlap; both must be 0.", contendingClients),
		shape: shapeContended,
	}
	shared = scenario{
		id: "shared8", title: fmt.Sprintf("4. %d goroutines sharing one lock object", sharingGoroutines),
		what: fmt.Sprintf("One client; %d goroutines loop lock → critical section → unlock on one lock object, as they would share a sync.Mutex. "+
			"Where a library's lock objects are not safe for concurrent use, each goroutine takes its own object from the shared client (see notes). Columns as in scenario 3, per goroutine.", sharingGoroutines),
		shape: shapeContended,
	}
	for i, n := range independentKeys {
		keys[i] = scenario{
			id: fmt.Sprintf("keys%d", n), title: fmt.Sprintf("5%c. Independent keys, %d goroutines", 'a'+i, n),
			what:   fmt.Sprintf("One client; %d goroutines, each looping lock + unlock on its own lock name: total ops/s, and latency per pair. Server µs/op and allocs/op as in scenario 2.", n),
			shape:  shapeOps,
			costOn: one[0],
		}
	}
	quorum = scenario{
		id: fmt.Sprintf("quorum%d", quorumServers), title: fmt.Sprintf("6. Quorum of %d independent servers, uncontended", quorumServers),
		what:  fmt.Sprintf("One client with a connection to each of %d redis-servers (netlock: %d backends; redsync: %d pools); one goroutine locks and unlocks in a loop.", quorumServers, quorumServers, quorumServers),
		shape: shapeOps,
	}
	waiting = scenario{
		id: waitingID, title: fmt.Sprintf("7. Waiting cost: %d clients waiting behind a holder", waitingClients),
		what: fmt.Sprintf("One client takes the lock and holds it; %d others, each its own client and connections (like separate processes), wait for it in the library's blocking lock, calling it again if it gives up. "+
			"After a %v warm-up, bench counts the commands Redis runs over a window (`INFO stats` total_commands_processed, commands that scripts call included, its own INFO left out): "+
			"commands per waiter-second = commands ÷ (%d × window); lower is better. The holder's extends fall in the window too: it holds for the warm-up and the window (by default %v + %v, longer than every contender's key expiry), so the window sees what waiters do when it extends. "+
			"Commands a client library sends by itself count too (rueidis: a PING on each connection idle for a second). "+
			"Top commands: the three with most calls in the window (`INFO commandstats`), per waiter-second. "+
			"Then the holder releases; after the release: waiters that got the lock (each unlocks at once) and the time until the last one's unlock returned, bounded by %v (then the rest are cancelled). "+
			"Gave up: lock calls that returned without the lock, called again at once. Overlaps: a waiter that got the lock while another client held it (must be 0). "+
			"Every client is closed after its row; a goroutine or server connection left behind is an error.", waitingClients, waitWarmup, waitingClients, waitWarmup, lockExpiry, waitDrain),
		shape: shapeWaiting,
	}
	holds = scenario{
		id: holdsID, title: fmt.Sprintf("8. %d holds in one process (netlock)", manyHolds),
		what: fmt.Sprintf("One client takes %d locks of distinct names at once (a LockCtx each, all together), holds them for `-holdfor` while their watchdogs extend them (expiry %v), then unlocks them all at once. "+
			"Lost: holds lost (`Observer.Lost`), found while held or at unlock; keys gone: unlocks that found the key gone or taken. "+
			"Peak server connections: `connected_clients` of `INFO clients`, sampled every %v over the whole row (the measuring connection included). "+
			"Peak goroutines: `runtime.NumGoroutine` of the bench process while all are held, sampled as often. "+
			"Extends/s: successful extends (`Observer.Extend`) while all are held, next to holds/(expiry/3), what a watchdog extending every third of the expiry makes. "+
			"CPU: the process's CPU time while all are held (getrusage), in cores. "+
			"Every client is closed after its row; a goroutine or server connection left behind is an error.", manyHolds, lockExpiry, holdsSampleEvery),
		shape: shapeHolds,
	}
	rwread = scenario{
		id: rwReadID, title: fmt.Sprintf("9. Read-mostly: %d processes, %.0f%% reads, NetRWMutex against NetMutex", rwProcesses, 100*rwReadShare),
		what: fmt.Sprintf("%d clients, each its own client object and connections (like separate processes), each with one lock object shared by %d goroutines (%d in all). "+
			"Each goroutine loops: with probability %.2f a read section (NetRWMutex: RLockCtx … RUnlockCtx), else a write section (LockCtx … UnlockCtx); the section itself is %s (`-rwsection`). "+
			"The NetMutex rows take the same NetMutex with LockCtx for both kinds, as a program without a read/write lock would: the same sequence of sections (a generator seeded per goroutine and round), another lock. "+
			"Reads/s and writes/s: sections whose acquire returned before the round's deadline; reads/s ÷ NetMutex's: against the NetMutex row of the same client (the goal is ≥ %.0f×). "+
			"Acquire latency: from RLockCtx (or LockCtx) called to its return, p50/p99. "+
			"Commands per section: what Redis ran while the row ran (`INFO commandstats`: the commands scripts call included, the client library's keepalive PINGs and bench's own INFO left out) over the sections counted; "+
			"scripts per section: the EVALSHA (and EVAL) calls among them, the round trips that run a script. "+
			"Overlaps: sections that found someone inside they must exclude (a writer with a reader or another writer; readers together are fine), looked at on entry and before leaving; lost writes: updates of a counter each write makes with a separate load and store, lost to overlap. "+
			"Both must be 0: a row with either is marked FAILED, and the run exits with an error after writing its report.",
			rwProcesses, rwGoroutines, rwProcesses*rwGoroutines, rwReadShare, sectionHow(rwSection), rwTarget()),
		shape:  shapeRW,
		strict: true,
	}
	rwwaiting = scenario{
		id: rwWaitingID, title: fmt.Sprintf("10. Waiting cost of NetRWMutex: %d readers behind a writer, %d writers behind a reader", waitingClients, waitingClients),
		what: fmt.Sprintf("As scenario 7, with a NetRWMutex: one client holds it, %d others, each its own client and connections (like separate processes), wait for it. "+
			"Readers: the holder writes (LockCtx) and the waiters read (RLockCtx); after the release they all get in together. "+
			"Writers: the holder reads (RLockCtx, its process's read lease) and the waiters write (LockCtx); after the release they get in one at a time. "+
			"The holder's watchdog extends its write lock or lease in the window. Commands per waiter-second and the other columns as in scenario 7; overlaps: a waiter let in with someone it must exclude (readers together are fine). The goal is ≤ 1 command per waiter-second.",
			waitingClients),
		shape:  shapeWaiting,
		strict: true,
	}
	sem = scenario{
		id: semID, title: fmt.Sprintf("11. Semaphore: %d processes × %d goroutines on %d permits, against %d NetMutex names", semProcesses, semGoroutines, semSize, semSize),
		what: fmt.Sprintf("%d clients, each its own client object and connections (like separate processes), each with %d goroutines (%d in all). "+
			"Semaphore rows: one *Semaphore of size %d per process, shared by its goroutines; each goroutine loops Acquire(ctx, 1), the critical section, Release(1). "+
			"NetMutex×%d rows, the comparison: the same %d permits as %d NetMutex names; each process has one *NetMutex per name, and goroutine g of each process loops LockCtx … UnlockCtx on name g mod %d (so %d processes, one goroutine each, contend for each name, and no goroutine ever waits for a name while another is free). "+
			"The critical section is %s (`-rwsection`). "+
			"Acquisitions/s: sections whose acquire returned before the round's deadline; × NetMutex×%d's: against that row of the same client. "+
			"Acquire wait: from Acquire (or LockCtx) called to its return, p50/p99. "+
			"Fairness: the fewest and most acquisitions of one process, and Jain's index ((Σx)²/(n·Σx²): 1 when all get as many, 1/n when one gets all) over the processes and over the goroutines. "+
			"Commands and scripts per acquisition as in scenario 9. "+
			"Overlaps: sections that found more holders inside than permits (Semaphore: more than %d; NetMutex: two on one name); must be 0, else the row is marked FAILED and the run exits with an error.",
			semProcesses, semGoroutines, semProcesses*semGoroutines, semSize, semSize, semSize, semSize, semSize, semProcesses, sectionHow(rwSection), semSize, semSize),
		shape:  shapeSem,
		strict: true,
	}
	semwaiting = scenario{
		id: semWaitingID, title: fmt.Sprintf("12. Waiting cost of a Semaphore: %d waiters behind a full one", waitingClients),
		what: fmt.Sprintf("As scenario 7, with a Semaphore of size %d: one client Acquires all %d permits and holds them (its watchdog extends its lease), %d others, each its own client and connections (like separate processes), wait in Acquire(ctx, 1). "+
			"After the release they get in, up to %d at a time. Commands per waiter-second and the other columns as in scenario 7; overlaps: a waiter let in while the holder held its permits. The goal is ≤ 1 command per waiter-second.",
			semSize, semSize, waitingClients, semSize),
		shape:  shapeWaiting,
		strict: true,
	}

	multis := multiScenarios()
	multiSlots := multiSlotsScenarios()
	elect := electScenario()
	once := onceScenario()
	for i := range cs {
		c := &cs[i]
		if c.waitingOnly {
			waiting.rows = append(waiting.rows, waitingRow(c, one[0]))
			continue
		}
		if c.role == roleReference {
			floor.rows = append(floor.rows, opsRow(c, "floor", one, 1))
		}
		uncontended.rows = append(uncontended.rows, opsRow(c, "uncontended", one, 1))
		for k, n := range independentKeys {
			keys[k].rows = append(keys[k].rows, opsRow(c, keys[k].id, one, n))
		}
		if c.role == roleReference {
			continue // the hand-written cycle does not wait
		}
		clients.rows = append(clients.rows, clientsRow(c, one))
		shared.rows = append(shared.rows, sharedRow(c, one))
		q := opsRow(c, quorum.id, addrs[:quorumServers], 1)
		q.na = c.noQuorum
		quorum.rows = append(quorum.rows, q)
		waiting.rows = append(waiting.rows, waitingRow(c, one[0]))
		if c.role == roleNetlock {
			holds.rows = append(holds.rows, holdsRow(c, one[0]))
			rwread.rows = append(rwread.rows, rwReadRows(c, one[0])...)
			rwwaiting.rows = append(rwwaiting.rows, rwWaitingRows(c, one[0])...)
			sem.rows = append(sem.rows, semRows(c, one[0])...)
			semwaiting.rows = append(semwaiting.rows, semWaitingRow(c, one[0]))
			for k := range multis {
				multis[k].rows = append(multis[k].rows, multiRows(c, onServer(multis[k].id, one[0]), multiSizes[k])...)
			}
			for k := range multiSlots {
				if c.connectCluster != nil {
					multiSlots[k].rows = append(multiSlots[k].rows, multiRows(c, onCluster(multiSlots[k].id), multiSizes[k])...)
				}
			}
			elect.rows = append(elect.rows, electRows(c, one[0])...)
			once.rows = append(once.rows, onceRows(c, one[0])...)
		}
	}
	out := []*scenario{&floor, &uncontended, &clients, &shared}
	for i := range keys {
		out = append(out, &keys[i])
	}
	out = append(out, &quorum, &waiting, &holds, &rwread, &rwwaiting, &sem, &semwaiting)
	for k := range multis {
		out = append(out, &multis[k])
	}
	for k := range multiSlots {
		out = append(out, &multiSlots[k])
	}
	return append(out, &elect, &once)
}

// lockName is a fresh lock name for one round of one row.
func lockName(scenario, row string, round, i int) string {
	return fmt.Sprintf("bench:%s:%s:%d:%d", scenario, row, round, i)
}

// opsRow: one client; n goroutines, each on its own lock name.
func opsRow(c *contender, id string, addrs []string, n int) *row {
	return &row{name: c.name, c: c, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		cl, err := c.connect(addrs)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, dur time.Duration, round int) result {
			ops := make([]func(context.Context) error, n)
			for i := range ops {
				l, err := cl.locker(lockName(id, c.name, round, i))
				if err != nil {
					var r result
					r.addErr(err)
					return r
				}
				ops[i] = lockUnlock(l)
			}
			return runOps(ctx, dur, ops)
		}, cl.close, nil
	}}
}

// clientsRow: contendingClients clients, one lock name.
func clientsRow(c *contender, addrs []string) *row {
	return &row{name: c.name, c: c, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		cls, closeAll, err := connectN(c, addrs, contendingClients)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, dur time.Duration, round int) result {
			name := lockName("clients", c.name, round, 0)
			lockers, err := makeLockers(len(cls), func(i int) (locker, error) { return cls[i].locker(name) })
			if err != nil {
				var r result
				r.addErr(err)
				return r
			}
			return runContended(ctx, dur, lockers)
		}, closeAll, nil
	}}
}

// makeLockers returns n lockers made by get, or get's first error.
func makeLockers(n int, get func(i int) (locker, error)) ([]locker, error) {
	lockers := make([]locker, n)
	for i := range lockers {
		var err error
		if lockers[i], err = get(i); err != nil {
			return nil, err
		}
	}
	return lockers, nil
}

// sharedRow: one client, sharingGoroutines goroutines on one lock object
// (or one each, if the library's objects are not safe for concurrent use).
func sharedRow(c *contender, addrs []string) *row {
	return &row{name: c.name, c: c, note: c.sharing, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		cl, err := c.connect(addrs)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, dur time.Duration, round int) result {
			name := lockName("shared", c.name, round, 0)
			var first locker
			lockers, err := makeLockers(sharingGoroutines, func(i int) (locker, error) {
				if i > 0 && cl.shared() {
					return first, nil
				}
				l, err := cl.locker(name)
				first = l
				return l, err
			})
			if err != nil {
				var r result
				r.addErr(err)
				return r
			}
			return runContended(ctx, dur, lockers)
		}, cl.close, nil
	}}
}
