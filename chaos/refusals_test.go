package chaos

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// serverArgs are the arguments of the chaos tests' redis-servers: AOF with
// fsync always, so that fence counters survive a crash; a save point that
// no run reaches (an hour), so that a failed save refuses writes
// (MISCONF) as it does on a server that snapshots; CONFIG SET dir allowed
// (a protected config), to make a save fail; and the BUSY reply after
// 50ms of a script rather than 5s, so that a long script refuses the
// others while a fault lasts.
var serverArgs = []string{
	"--appendonly", "yes", "--appendfsync", "always",
	"--save", "3600 1", "--enable-protected-configs", "yes",
	"--busy-reply-threshold", "50",
}

// refusalKinds are the faults by which Redis refuses calls for a while,
// besides the network's and the process's:
//
//   - readonly: the server is demoted (REPLICAOF a port nothing listens
//     on: it keeps its data and answers READONLY to writes) and promoted
//     again (REPLICAOF NO ONE), as a failover does;
//   - loading: killed, and restarted after the expiry (as kill) with a
//     slow load of its data, answering LOADING meanwhile;
//   - misconf: a save fails (dir /proc), and writes are refused (MISCONF)
//     until a save succeeds;
//   - oom: maxmemory below use, with noeviction: writes that take memory
//     are refused (OOM);
//   - busy: a script of another client runs for the hold, and the server
//     answers BUSY to the others;
//   - pause-write: CLIENT PAUSE WRITE, as a managed failover does: writes
//     wait;
//   - script-flush: SCRIPT FLUSH, again every 100ms for the hold: the
//     clients' scripts are gone (NOSCRIPT);
//   - client-kill: CLIENT KILL of every client connection, ordinary and
//     pub/sub, again every 250ms for the hold;
//   - acl: the default user loses its channel rights (the scripts that
//     publish and the subscriptions are refused, NOPERM, and its pub/sub
//     connections are closed) and gets them back.
//
// readonly and loading are not for a Redis Cluster: REPLICAOF is refused
// in cluster mode, and its nodes hold no filler keys (see addFillers).
// busy and misconf are left out unless NETLOCK_CHAOS_ALL=1 or no client
// is a rueidis one (see rueidisPanics).
var refusalKinds = []string{"readonly", "loading", "misconf", "oom", "busy", "pause-write", "script-flush", "client-kill", "acl"}

const (
	// deadPort is the port of the master a demoted server is told to
	// replicate: nothing listens on it, so the server never syncs (a
	// sync would flush its data) and keeps retrying.
	deadPort = "1"
	// fillers is how many filler keys (fillerKey) each server holds, for
	// a restart to load slowly: one millisecond each (loadingArgs), a
	// second or so in all.
	fillers = 1000
	// fillerKey is the prefix of the filler keys, outside netlock's.
	fillerKey = "chaos-filler:"
)

// loadingArgs make a restarted server load its data slowly, a millisecond
// a key of its AOF's base and a command after it, and answer the clients
// (LOADING) every KiB of the base loaded.
var loadingArgs = []string{"--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024"}

// busyScript runs for ARGV[1] microseconds, reading the clock, and writes
// nothing.
const busyScript = `local t = redis.call('TIME')
local from = t[1] * 1000000 + t[2]
repeat
	t = redis.call('TIME')
until t[1] * 1000000 + t[2] - from >= tonumber(ARGV[1])
return 1`

// faultKinds returns the kinds of fault runFaults injects on s's servers:
// rueidisPanics only with NETLOCK_CHAOS_ALL=1, or when no client is a
// rueidis one (NETLOCK_CHAOS_CLIENTS).
func faultKinds(t testing.TB, s chaosSetup) []string {
	t.Helper()
	panics := os.Getenv(allFaultsEnv) != "1" && slices.Contains(chaosLibraries(t), "rueidis")
	kinds := []string{"pause", "kill", "latency", "blackhole", "reset"}
	for _, k := range refusalKinds {
		if s.cluster && (k == "readonly" || k == "loading") || panics && slices.Contains(rueidisPanics, k) {
			continue
		}
		kinds = append(kinds, k)
	}
	return kinds
}

// addFillers writes the filler keys to every server, for a restart under
// loadingArgs to load them slowly. A Cluster's nodes get none.
func addFillers(t *testing.T, s chaosSetup, servers []*redistest.Server) {
	t.Helper()
	if s.cluster {
		return
	}
	const fill = `for i = 1, tonumber(ARGV[2]) do redis.call('SET', ARGV[1] .. i, 'x') end return 1`
	for k, srv := range servers {
		if _, err := srv.Do("EVAL", fill, "0", fillerKey, strconv.Itoa(fillers)); err != nil {
			t.Fatalf("server %d: filler keys: %v", k, err)
		}
	}
}

// waitInfo waits (a bounded time) until INFO section of s shows every
// field of want, "name:value".
func waitInfo(t *testing.T, s *redistest.Server, section string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := s.Do("INFO", section)
		missing := ""
		for _, w := range want {
			if err == nil && !strings.Contains(info, w+"\r\n") {
				missing = w
				break
			}
		}
		if err == nil && missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("INFO %s of %s: want %s within 10s; err %v", section, s.Addr(), missing, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mustDo sends a command to s and fails the test on an error reply.
func mustDo(t *testing.T, s *redistest.Server, args ...string) string {
	t.Helper()
	reply, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%s on %s: %v", strings.Join(args, " "), s.Addr(), err)
	}
	return reply
}

// refuse injects a fault of refusalKinds on the victims for hold, from the
// test goroutine, and returns once it is over: once every victim takes
// every call again. wait is how long a loading fault waits between the
// kill and the restart (see kill in runFaults). It returns what the fault
// did that the servers' error replies do not show: the connections a
// client-kill closed.
func refuse(t *testing.T, kind string, victims []*redistest.Server, hold, wait time.Duration) (did map[string]int) {
	t.Helper()
	each := func(args ...string) {
		for _, v := range victims {
			mustDo(t, v, args...)
		}
	}
	switch kind {
	case "readonly":
		each("REPLICAOF", "127.0.0.1", deadPort)
		time.Sleep(hold)
		each("REPLICAOF", "NO", "ONE")
	case "loading":
		// The key-load-delay slows the load of every key of the AOF's
		// base and every command after it: a rewrite first puts all in
		// the base, which the server answers during (every KiB), where
		// a long tail of commands would keep it silent for seconds.
		for _, v := range victims {
			mustDo(t, v, "BGREWRITEAOF")
		}
		for _, v := range victims {
			waitInfo(t, v, "persistence", "aof_rewrite_in_progress:0", "aof_rewrite_scheduled:0")
			v.Kill()
		}
		time.Sleep(wait)
		// RestartWith returns when the server answers PING, which it
		// refuses (LOADING) until its data is loaded.
		for _, v := range victims {
			v.RestartWith(loadingArgs...)
		}
	case "misconf":
		dirs := make([]string, len(victims))
		for k, v := range victims {
			dir := strings.Split(mustDo(t, v, "CONFIG", "GET", "dir"), "\n")
			dirs[k] = dir[len(dir)-1]
			mustDo(t, v, "CONFIG", "SET", "dir", "/proc")
			mustDo(t, v, "BGSAVE", "SCHEDULE")
		}
		for _, v := range victims {
			waitInfo(t, v, "persistence", "rdb_bgsave_in_progress:0", "rdb_last_bgsave_status:err")
		}
		time.Sleep(hold)
		for k, v := range victims {
			mustDo(t, v, "CONFIG", "SET", "dir", dirs[k])
			mustDo(t, v, "BGSAVE", "SCHEDULE")
		}
		for _, v := range victims {
			waitInfo(t, v, "persistence", "rdb_bgsave_in_progress:0", "rdb_last_bgsave_status:ok")
		}
	case "oom":
		each("CONFIG", "SET", "maxmemory", "1")
		time.Sleep(hold)
		each("CONFIG", "SET", "maxmemory", "0")
	case "busy":
		// Do waits for the script's reply: one goroutine a victim, so
		// that they are busy together. The script ends by its own clock.
		var wg sync.WaitGroup
		errs := make([]error, len(victims))
		for k, v := range victims {
			wg.Go(func() { _, errs[k] = v.Do("EVAL", busyScript, "0", strconv.FormatInt(hold.Microseconds(), 10)) })
		}
		wg.Wait()
		for k, err := range errs {
			if err != nil {
				t.Fatalf("busy script on %s: %v", victims[k].Addr(), err)
			}
		}
	case "pause-write":
		each("CLIENT", "PAUSE", strconv.FormatInt(hold.Milliseconds(), 10), "WRITE")
		time.Sleep(hold)
		each("CLIENT", "UNPAUSE")
	case "script-flush":
		repeatFor(hold, 100*time.Millisecond, func() { each("SCRIPT", "FLUSH") })
	case "client-kill":
		// Every connection but this command's own (SKIPME yes): the
		// clients' through their proxies, none of this test's, which
		// makes one per command.
		did = map[string]int{}
		repeatFor(hold, 250*time.Millisecond, func() {
			for _, v := range victims {
				for _, typ := range []string{"normal", "pubsub"} {
					n, _ := strconv.Atoi(mustDo(t, v, "CLIENT", "KILL", "TYPE", typ))
					did["connections killed"] += n
				}
			}
		})
	case "acl":
		each("ACL", "SETUSER", "default", "resetchannels")
		time.Sleep(hold)
		each("ACL", "SETUSER", "default", "allchannels")
	default:
		panic(fmt.Sprintf("chaos: no fault %q", kind))
	}
	return did
}

// repeatFor calls f at once, and again every period until d has passed.
func repeatFor(d, period time.Duration, f func()) {
	end := time.Now().Add(d)
	for {
		f()
		left := time.Until(end)
		if left <= 0 {
			return
		}
		time.Sleep(min(period, left))
	}
}

// errorStats returns, for each of the victims, the refusals its server
// has answered since it started, by code (INFO errorstats, of the codes
// of refusalCodes); nil for a server that did not answer.
func errorStats(servers []*redistest.Server, victims []int) []map[string]int {
	stats := make([]map[string]int, len(victims))
	for k, v := range victims {
		info, err := servers[v].Do("INFO", "errorstats")
		if err != nil {
			continue
		}
		stats[k] = map[string]int{}
		for line := range strings.SplitSeq(info, "\n") {
			// errorstat_READONLY:count=12
			code, count, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "errorstat_"), ":count=")
			if n, err := strconv.Atoi(count); ok && err == nil && slices.Contains(refusalCodes, code) {
				stats[k][code] = n
			}
		}
	}
	return stats
}

// answeredSince returns the error replies the victims gave between two
// errorStats, by code. A server that restarted meanwhile counts from its
// start.
func answeredSince(before, after []map[string]int) map[string]int {
	answered := map[string]int{}
	for k := range after {
		restarted := false
		for code, n := range before[k] {
			restarted = restarted || after[k][code] < n
		}
		for code, n := range after[k] {
			if !restarted {
				n -= before[k][code]
			}
			if n > 0 {
				answered[code] += n
			}
		}
	}
	return answered
}
