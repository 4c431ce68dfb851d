// Package chaos holds netlock's fault-injection tests; it has no API of its
// own. Its tests run clients of every client library netlock supports (or
// of those NETLOCK_CHAOS_CLIENTS selects, below) against real redis-server processes (started by internal/redistest), each
// client reaching each server through a toxiproxy of its own (package
// chaos/internal/toxi), and break things while the clients lock: servers
// paused, killed and restarted, links slowed, blackholed, reset and cut
// mid-reply, clients frozen in their critical sections; and Redis's own
// refusals (refusals_test.go): a server demoted to a replica and promoted
// again (READONLY), restarted with a slow load (LOADING), failing to save
// (MISCONF), out of memory (OOM), busy with a long script (BUSY), paused
// for writes (CLIENT PAUSE WRITE), its scripts flushed (SCRIPT FLUSH),
// its clients' connections killed (CLIENT KILL), and the user's channel
// rights taken away and given back (NOPERM). Each run logs, by kind of
// fault, the refusals the servers hit answered meanwhile. The busy and
// misconf faults are left out unless NETLOCK_CHAOS_ALL=1 or no client is a
// rueidis one: under them, rueidis panics when it unsubscribes
// (TestRueidisUnsubscribeRefused).
//
// Besides each workload's own checks, the NetMutex, RW, Semaphore and
// Election tests check that a lock never stays free while clients wait for
// it once a fault has cleared (checkFreed; for a Semaphore, permits enough
// for any waiter), and the fenced resources'
// histories (NetMutex, RW, Multi, Election) are checked for
// linearizability against a fenced register by porcupine
// (checkLinearizable).
//
// It is a module of its own, github.com/netlock-go/netlock/chaos, so that
// toxiproxy and what it brings (prometheus, gorilla/mux, zerolog, protobuf)
// stay out of the library's go.mod. It tests the library checked out next
// to it (a replace directive) and only through its exported API: what it
// must know of a hold (how it came, where its local deadline lies) it learns
// from a Backend wrapper and an Observer, as a user could.
//
// Run it as CI does, from this directory:
//
//	NETLOCK_REQUIRE_REDIS=1 go test -race ./...
//
// TestChaos and TestChaosSingle lock a NetMutex; TestChaosRW and
// TestChaosRWSingle run readers and writers on a NetRWMutex under the same
// faults, checked by checkRWHistory.
//
// NETLOCK_SOAK=10m runs each chaos test for ten minutes instead of 20s (add
// -timeout 30m); NETLOCK_REPORT names a file to which the tests append their
// figures.
//
// NETLOCK_CHAOS_CLIENTS, a comma-separated subset of redigo, rueidis and
// goredis, runs the chaos tests' clients on those client libraries alone,
// by turns (TestChaosMultiSlots on those with a cluster client, skipped if
// none has); without rueidis, busy and misconf are in the rotation:
//
//	NETLOCK_REQUIRE_REDIS=1 NETLOCK_CHAOS_CLIENTS=redigo,goredis NETLOCK_SOAK=10m go test -run 'TestChaos$' -count=1 -timeout 30m -v .
//
// Each chaos test logs the seed of its faults ("faults from seed N");
// NETLOCK_CHAOS_SEED=N gives it back to a run, to replay a failing soak:
//
//	NETLOCK_REQUIRE_REDIS=1 NETLOCK_SOAK=5m NETLOCK_CHAOS_SEED=N go test -run 'TestChaosRW$' -count=1 -timeout 20m -v .
//
// The same faults then come in the same order (kinds, servers, clients,
// durations, the clients told to stall); the clients' timing, and so how
// the faults meet their calls, is the run's own.
package chaos
