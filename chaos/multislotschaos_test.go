package chaos

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredislib "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/chaos/internal/toxi"
	"github.com/netlock-go/netlock/goredis"
	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// slotsMasters is how many masters the Cluster of TestChaosMultiSlots has.
const slotsMasters = 3

// slotsNames are the lock names of TestChaosMultiSlots: three in three
// slots, one in each third of the slots (redis-cli gives each of three
// masters a third), and two sharing a hash tag (one slot).
var slotsNames = func() []string {
	var names []string
	for third, i := 0, 0; third < slotsMasters; i++ {
		name := "s" + strconv.Itoa(i)
		if int(keyspace.Slot(lockKey(name)))*slotsMasters/16384 == third {
			names = append(names, name)
			third++
		}
	}
	return append(names, "{t}:x", "{t}:y")
}()

// TestChaosMultiSlots is TestChaosMulti on a Redis Cluster of three masters
// (AOF, fsync always), with MultiMutexes whose names are in several slots,
// taken one slot group at a time by the protocol of docs/multi.md ("Names in
// several slots"): eight clients, each a cluster client of its own
// (rueidis and go-redis by turns, or the one of them NETLOCK_CHAOS_CLIENTS
// selects) that reaches each master through a
// toxiproxy of its own, take MultiMutexes of two to four of five names in
// three or four slots, given in different orders, and NetMutexes of single
// names. Faults hit one master at a time, as TestChaos's hit a server: the
// slots of that master are out while it lasts, the others not. The history
// of every name is checked as TestChaosMulti's (checkHistory: no overlap of
// holds never reported lost, tokens increasing, every stale write refused,
// Lost() in time), and no key may be left on its master once the clients
// stop.
//
// It runs chaosCI by default, or for NETLOCK_SOAK.
func TestChaosMultiSlots(t *testing.T) {
	clusterLibraries(t) // skips before the Cluster starts, if none is selected
	runChaosLocks(t, slotsSetup, chaosSetup{
		nodes:   slotsMasters,
		cluster: true,
		victims: func(rng *rand.Rand) []int { return []int{rng.IntN(slotsMasters)} },
		quiet:   func(rng *rand.Rand) time.Duration { return time.Duration(rng.IntN(300)) * time.Millisecond },
	})
}

var slotsSetup = locksSetup{
	what:  fmt.Sprintf("MultiMutexes of 2 to 4 of %d names in several slots and NetMutexes", len(slotsNames)),
	names: slotsNames,
	keys: func() []string {
		var keys []string
		for _, n := range slotsNames {
			keys = append(keys, lockKey(n))
		}
		return keys
	}(),
	locks: slotsLocks,
}

// slotsLocks returns a client's lock objects on its cluster Backend:
// MultiMutexes whose names are in several slots, in orders of their own,
// and NetMutexes of single names.
func slotsLocks(t *testing.T, backends []netlock.Backend) []multiLock {
	t.Helper()
	a, b, c, x, y := slotsNames[0], slotsNames[1], slotsNames[2], slotsNames[3], slotsNames[4]
	return namedLocks(t, backends, [][]string{{a, b}, {c, b, a}, {y, c, x}, {a, x, b, y}, {c, a}}, []string{b, a, x})
}

// deploy starts the servers of s: independent ones, or the masters of a
// Redis Cluster.
func deploy(t *testing.T, s chaosSetup) []*redistest.Server {
	t.Helper()
	if !s.cluster {
		return startServers(t, s.nodes, serverArgs...)
	}
	return redistest.StartClusterReplicas(t, s.nodes, 0, serverArgs...).Servers()
}

// clientBackends returns client i's Backends on the servers of s, through
// its links (one per server): one per server, or one cluster client.
func clientBackends(t *testing.T, s chaosSetup, i int, servers []*redistest.Server, links []*toxi.Proxy) []netlock.Backend {
	t.Helper()
	if !s.cluster {
		backends := make([]netlock.Backend, len(servers))
		for k := range servers {
			backends[k] = newBackend(t, chaosClient(t, i), links[k].Addr())
		}
		return backends
	}
	via := map[string]string{}
	var addrs []string
	for k, srv := range servers {
		via[srv.Addr()] = links[k].Addr()
		addrs = append(addrs, srv.Addr())
	}
	libs := clusterLibraries(t)
	return []netlock.Backend{newClusterBackend(t, libs[i%len(libs)], addrs, via)}
}

// clusterClients are the client libraries with a cluster client.
var clusterClients = []string{"rueidis", "goredis"}

// clusterLibraries returns those of chaosLibraries that have a cluster
// client, and skips the test if none has.
func clusterLibraries(t testing.TB) []string {
	t.Helper()
	libs := slices.DeleteFunc(chaosLibraries(t), func(c string) bool { return !slices.Contains(clusterClients, c) })
	if len(libs) == 0 {
		t.Skipf("%s=%s names no client library with a cluster client (%s)", clientsEnv, os.Getenv(clientsEnv), strings.Join(clusterClients, ", "))
	}
	return libs
}

// newClusterBackend returns a Backend on a cluster client of its own of the
// Cluster of addrs, as another process would have, that dials each node
// through via[addr] (the node's address as the cluster gives it, in CLUSTER
// SLOTS and MOVED); the client is closed when the test ends.
func newClusterBackend(t testing.TB, client string, addrs []string, via map[string]string) netlock.Backend {
	t.Helper()
	route := func(addr string) string {
		if p, ok := via[addr]; ok {
			return p
		}
		return addr
	}
	switch client {
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:  addrs,
			DisableCache: true,
			// A call that finds rueidis dialing a node again waits for the
			// dial, whatever its context says (see TestMultiCluster's
			// SlotsNodeDown): bounded here.
			Dialer:           net.Dialer{Timeout: 300 * time.Millisecond},
			ConnWriteTimeout: 300 * time.Millisecond,
			DialCtxFn: func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", route(addr))
			},
		})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%q): %v", addrs, err)
		}
		t.Cleanup(c.Close)
		return netlock.NewRueidis(c)
	case "goredis":
		c := goredislib.NewClusterClient(&goredislib.ClusterOptions{
			Addrs:                 addrs,
			ContextTimeoutEnabled: true,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, route(addr))
			},
		})
		t.Cleanup(func() { c.Close() })
		return goredis.New(c)
	}
	t.Fatalf("unknown cluster client %q", client)
	return nil
}

// namedLocks returns a client's lock objects on backends: a MultiMutex of
// each of sets, and a NetMutex of each of singles, each with the chaos
// options and a deadlineBound of its own.
func namedLocks(t *testing.T, backends []netlock.Backend, sets [][]string, singles []string) []multiLock {
	t.Helper()
	opts := func(b *deadlineBound) []netlock.Option {
		return []netlock.Option{netlock.WithExpiry(chaosExpiry), netlock.WithNodeTimeout(100 * time.Millisecond),
			netlock.WithDriftFactor(chaosDrift), netlock.WithRetryDelay(time.Millisecond, 20*time.Millisecond),
			netlock.WithObserver(b.observer()), netlock.WithLogger(slog.New(slog.DiscardHandler))}
	}
	bound := func() *deadlineBound {
		return &deadlineBound{expiry: chaosExpiry - time.Duration(float64(chaosExpiry)*chaosDrift) - 2*time.Millisecond}
	}
	var locks []multiLock
	for _, names := range sets {
		b := bound()
		mm, err := netlock.NewMulti(names, backends, opts(b)...)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, multiLock{names: names, lock: mm.LockCtx, unlock: mm.UnlockCtx, lost: mm.Lost, tokens: mm.Tokens, bound: b})
	}
	for _, name := range singles {
		b := bound()
		m, err := netlock.New(name, backends, opts(b)...)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, multiLock{names: []string{name}, lock: m.LockCtx, unlock: m.UnlockCtx, lost: m.Lost,
			tokens: func() []uint64 { return []uint64{m.Token()} }, bound: b})
	}
	return locks
}
