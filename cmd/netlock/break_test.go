package main

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/fence"
	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
	redisv9 "github.com/redis/go-redis/v9"
)

// breakHolder takes the lock name on addr as a NetMutex of its own, with
// expiry, and releases it (if it still can) when the test ends.
func breakHolder(t *testing.T, addr, name string, expiry time.Duration) *netlock.NetMutex {
	t.Helper()
	m, err := netlock.New(name, listBackends(t, addr), netlock.WithExpiry(expiry))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.LockCtx(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.UnlockCtx(context.Background()) }) // a broken hold's unlock fails: nothing to check
	return m
}

// TestBreakAliveHolder: a holder that extends is not broken without
// --force; break names its token and says how to break it anyway.
func TestBreakAliveHolder(t *testing.T) {
	s := redistest.Start(t)
	m := breakHolder(t, s.Addr(), "job", 3*time.Second)
	value := redisDo(t, s, "GET", lockKey("job"))

	start := time.Now()
	code, stdout, stderr := runCmd(t, t.Context(), "break", "--redis", s.Addr(), "job")
	if code != exitRefused {
		t.Errorf("exit %d, want %d", code, exitRefused)
	}
	// A third of the 3s TTL and the margin; not --check's 3s.
	if took := time.Since(start); took < time.Second || took > 2500*time.Millisecond {
		t.Errorf("took %v, want about 1.25s", took)
	}
	if stdout != "" {
		t.Errorf("stdout: got %q, want nothing", stdout)
	}
	// The holder names itself: this process, by default.
	host, _ := os.Hostname()
	holder := regexp.QuoteMeta(strconv.Quote(host + "/" + strconv.Itoa(os.Getpid())))
	want := regexp.MustCompile(`^netlock break: lock "job" is held by fencing token ` + strconv.FormatUint(m.Token(), 10) +
		`, TTL [0-9.]+m?s, holder ` + holder + `, and its holder is alive: the key's TTL went from [0-9.]+m?s to [0-9.]+m?s in [0-9.]+m?s, where without an extend it would have fallen to at most [0-9.]+m?s; --force breaks it anyway\n$`)
	if !want.MatchString(stderr) {
		t.Errorf("stderr %q does not match %v", stderr, want)
	}
	if got := redisDo(t, s, "GET", lockKey("job")); got != value {
		t.Errorf("the key holds %q after the refusal, want the holder's %q", got, value)
	}
	select {
	case <-m.Lost():
		t.Error("the holder lost the lock")
	default:
	}
}

// TestBreakForce: --force ends a live hold at once; the fence counter
// stays at or above its token, the waiter gets in without waiting for the
// TTL with a higher token, the broken holder sees Lost by its next extend,
// and its fenced write, after the new holder's, is refused.
func TestBreakForce(t *testing.T) {
	s := redistest.Start(t)
	const expiry = 6 * time.Second
	a := breakHolder(t, s.Addr(), "job", expiry)
	tokenA := a.Token()
	data := listBackends(t, s.Addr())[0]
	if err := fence.Set(t.Context(), data, "report", "by A", tokenA); err != nil {
		t.Fatalf("A's fenced write while it holds: %v", err)
	}

	b, err := netlock.New("job", listBackends(t, s.Addr()), netlock.WithExpiry(expiry))
	if err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		locked <- b.LockCtx(ctx)
	}()
	waitFor(t, "B to queue", func() bool { return redisDo(t, s, "ZCARD", keyspace.New("netlock:", "job", true).Waiters) == "1" })

	start := time.Now()
	code, stdout, stderr := runCmd(t, t.Context(), "break", "--force", "--redis", s.Addr(), "job")
	if code != exitBroken {
		t.Errorf("exit %d, want %d", code, exitBroken)
	}
	if stderr != "" {
		t.Errorf("stderr: got %q, want nothing", stderr)
	}
	tok := strconv.FormatUint(tokenA, 10)
	if !strings.HasPrefix(stdout, `lock "job": broken: the hold of fencing token `+tok+" ended; the fence counter is "+tok+"\n") ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(s.Addr())+`\s+broken\s+`+tok+`\s+`+tok+`\s+told its turn$`).MatchString(stdout) {
		t.Errorf("stdout does not report the break of token %s and a waiter told:\n%s", tok, stdout)
	}

	select {
	case err := <-locked:
		if err != nil {
			t.Fatalf("B: %v", err)
		}
	case <-time.After(expiry / 2):
		t.Fatalf("B did not get the lock within %v of the break; A's TTL was up to %v", expiry/2, expiry)
	}
	t.Cleanup(func() { b.UnlockCtx(context.Background()) })
	if took := time.Since(start); took > time.Second {
		t.Errorf("B got the lock %v after the break began, want at once", took)
	}
	if b.Token() <= tokenA {
		t.Errorf("B's token %d, want above the broken %d", b.Token(), tokenA)
	}
	if c, _ := strconv.ParseUint(redisDo(t, s, "GET", fenceKey("job")), 10, 64); c < tokenA {
		t.Errorf("fence counter %d, want at least the broken token %d", c, tokenA)
	}

	select {
	case <-a.Lost():
	case <-time.After(expiry/extendsPerExpiry + 2*time.Second):
		t.Fatalf("A's Lost did not close within its extend interval %v and 2s", expiry/extendsPerExpiry)
	}

	if err := fence.Set(t.Context(), data, "report", "by B", b.Token()); err != nil {
		t.Fatalf("B's fenced write: %v", err)
	}
	if err := fence.Set(t.Context(), data, "report", "by A, late", tokenA); !errors.Is(err, fence.ErrStale) {
		t.Errorf("A's fenced write after the break: got %v, want ErrStale", err)
	}
	if got := redisDo(t, s, "HGET", "report", fence.ValueField); got != "by B" {
		t.Errorf("report holds %q, want B's write", got)
	}
}

// TestBreakDeadHolder: a key that nobody extends is broken without
// --force, after the check; the fence counter is raised to its token.
func TestBreakDeadHolder(t *testing.T) {
	s := redistest.Start(t)
	redisDo(t, s, "SET", lockKey("job"), "r4nd0m:5", "PX", "3000")
	redisDo(t, s, "SET", fenceKey("job"), "2") // below the token: a counter lost and started again

	code, stdout, stderr := runCmd(t, t.Context(), "break", "--redis", s.Addr(), "job")
	if code != exitBroken || stderr != "" {
		t.Errorf("exit %d, stderr %q; want %d and nothing", code, stderr, exitBroken)
	}
	if !strings.HasPrefix(stdout, `lock "job": broken: the hold of fencing token 5 ended; the fence counter is 5`+"\n") ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(s.Addr())+`\s+broken\s+5\s+5\s+none waiting$`).MatchString(stdout) {
		t.Errorf("stdout does not report the break of token 5:\n%s", stdout)
	}
	if got := redisDo(t, s, "EXISTS", lockKey("job")); got != "0" {
		t.Errorf("EXISTS of the key: %s, want 0", got)
	}
	if got := redisDo(t, s, "GET", fenceKey("job")); got != "5" {
		t.Errorf("fence counter %s, want 5", got)
	}

	// Not held: nothing to break, exit 0 at once.
	code, stdout, _ = runCmd(t, t.Context(), "break", "--redis", s.Addr(), "job")
	if code != exitBroken || stdout != `lock "job": not held: nothing to break`+"\n" {
		t.Errorf("not held: exit %d, stdout %q; want %d and nothing to break", code, stdout, exitBroken)
	}
}

// TestBreakRefusedAtSight: without --force, break refuses at once what it
// cannot tell dead by waiting; --force breaks it.
func TestBreakRefusedAtSight(t *testing.T) {
	s := redistest.Start(t)
	for _, tc := range []struct {
		name  string
		set   []string // the lock key's SET arguments after the key
		args  []string
		want  string
		token string
	}{
		{"no TTL", []string{"r4nd0m:7"}, nil, `the key on ` + s.Addr() + ` \(fencing token 7\) has no TTL, which netlock always sets`, "7"},
		{"foreign", []string{"not netlock's", "PX", "60000"}, nil, `the key on ` + s.Addr() + ` holds a value netlock did not write`, "0"},
		{"longer than --check", []string{"r4nd0m:7", "PX", "60000"}, nil,
			`is held by fencing token 7, TTL [0-9ms.]+: telling whether its holder is alive takes up to 20\.2[0-9]*s .* more than --check 3s; give --check 21s, or --force`, "7"},
		{"--check 0", []string{"r4nd0m:7", "PX", "60000"}, []string{"--check", "0"}, `more than --check 0s`, "7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			redisDo(t, s, append([]string{"SET", lockKey("job")}, tc.set...)...)
			start := time.Now()
			code, stdout, stderr := runCmd(t, t.Context(), append(append([]string{"break", "--redis", s.Addr()}, tc.args...), "job")...)
			if code != exitRefused || stdout != "" {
				t.Errorf("exit %d, stdout %q; want %d and nothing", code, stdout, exitRefused)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("took %v, want a refusal at once", took)
			}
			if !regexp.MustCompile(`^netlock break: lock "job"[: ].*` + tc.want).MatchString(stderr) {
				t.Errorf("stderr %q does not say %q", stderr, tc.want)
			}
			if got := redisDo(t, s, "EXISTS", lockKey("job")); got != "1" {
				t.Errorf("the key is gone after the refusal")
			}
			code, stdout, _ = runCmd(t, t.Context(), "break", "--force", "--redis", s.Addr(), "job")
			if code != exitBroken || !regexp.MustCompile(`(?m)\s+broken\s+`+tc.token+`\s`).MatchString(stdout) {
				t.Errorf("--force: exit %d, want %d, and a row broken with token %s:\n%s", code, exitBroken, tc.token, stdout)
			}
			if got := redisDo(t, s, "EXISTS", lockKey("job")); got != "0" {
				t.Errorf("--force: the key is still there")
			}
		})
	}
}

// TestBreakOtherKinds: names held as a NetRWMutex or a Semaphore are
// refused with exit 64, and left held.
func TestBreakOtherKinds(t *testing.T) {
	s := redistest.Start(t)
	ctx := t.Context()
	opts := netlock.WithExpiry(30 * time.Second)
	rw, err := netlock.NewRW("catalog", listBackends(t, s.Addr()), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.LockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rw.UnlockCtx(context.Background()) })
	sem, err := netlock.NewSemaphore("payments", 2, listBackends(t, s.Addr()), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := sem.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sem.ReleaseCtx(context.Background(), 1) })

	for name, kind := range map[string]string{"catalog": "NetRWMutex", "payments": "Semaphore"} {
		code, stdout, stderr := runCmd(t, ctx, "break", "--force", "--redis", s.Addr(), name)
		if code != exitUsage || stdout != "" {
			t.Errorf("%s: exit %d, stdout %q; want %d and nothing", name, code, stdout, exitUsage)
		}
		if want := `netlock break: lock "` + name + `" is held as a ` + kind + `: break ends NetMutex holds only`; !strings.HasPrefix(stderr, want) {
			t.Errorf("%s: stderr %q does not start with %q", name, stderr, want)
		}
	}
	select {
	case <-rw.Lost():
		t.Error("the NetRWMutex lost its hold")
	case <-sem.Lost():
		t.Error("the Semaphore lost its lease")
	default:
	}
}

// TestBreakQuorum: over three nodes, break runs on each that answers and
// reports each; a node down is named, with exit 69.
func TestBreakQuorum(t *testing.T) {
	servers := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	args := []string{"break", "--force"}
	for _, s := range servers {
		redisDo(t, s, "SET", lockKey("job"), "r4nd0m:7", "PX", "60000")
		args = append(args, "--redis", s.Addr())
	}
	servers[2].Stop()
	code, stdout, stderr := runCmd(t, t.Context(), append(args, "job")...)
	if code != exitUnavailable {
		t.Errorf("exit %d, want %d", code, exitUnavailable)
	}
	if !strings.HasPrefix(stdout, `lock "job": broken on 2 of 3 nodes (fencing token up to 7) on the nodes that answered; 1 of 3 could not be asked`) {
		t.Errorf("stdout does not summarise the break on 2 of 3 nodes:\n%s", stdout)
	}
	for i, s := range servers[:2] {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(s.Addr()) + `\s+broken\s+7\s+7\s+none waiting$`).MatchString(stdout) {
			t.Errorf("no row broken for node %d:\n%s", i, stdout)
		}
		if got := redisDo(t, s, "EXISTS", lockKey("job")); got != "0" {
			t.Errorf("node %d still holds the key", i)
		}
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(servers[2].Addr()) + `\s+error\s+-\s+-\s+-$`).MatchString(stdout) {
		t.Errorf("no error row for node 2:\n%s", stdout)
	}
	if want := "netlock break: Redis at node 2 " + servers[2].Addr() + " not answering: "; !strings.HasPrefix(stderr, want) || !strings.Contains(stderr, "connection refused") {
		t.Errorf("stderr %q does not name node 2 and its error", stderr)
	}
}

// TestBreakBadInput: usage errors exit 64 and change nothing; a server
// that cannot be reached, or is not Redis, exits 69 and says so.
func TestBreakBadInput(t *testing.T) {
	t.Setenv(envRedis, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing the lock name"},
		{[]string{"a", "b"}, `unexpected "b" after the lock name`},
		{[]string{"a", "--force"}, `unexpected "--force" after the lock name: flags go before NAME`},
		{[]string{"--nope", "a"}, "unknown flag --nope"},
		{[]string{""}, "empty lock name"},
		{[]string{"}x"}, `lock name "}x" starts with '}'`},
		{[]string{"--check", "soon", "a"}, `invalid value "soon" for --check`},
		{[]string{"--force=maybe", "a"}, `invalid value "maybe" for --force`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), append([]string{"break", "--redis", closedPort(t)}, tc.args...)...)
			if code != exitUsage || stdout != "" {
				t.Errorf("exit %d, stdout %q; want %d and nothing", code, stdout, exitUsage)
			}
			if first, _, _ := strings.Cut(stderr, "\n"); !strings.HasPrefix(first, "netlock break: ") || !strings.Contains(first, tc.want) || strings.Contains(first, "netlock: ") {
				t.Errorf("stderr's first line %q does not say %q (once netlock)", first, tc.want)
			}
		})
	}

	t.Run("unreachable", func(t *testing.T) {
		addr := closedPort(t)
		code, stdout, stderr := runCmd(t, t.Context(), "break", "--force", "--redis", addr, "job")
		if code != exitUnavailable || stdout != "" {
			t.Errorf("exit %d, stdout %q; want %d and nothing", code, stdout, exitUnavailable)
		}
		if want := "netlock break: Redis at " + addr + " not answering: dial tcp " + addr + ": connect: connection refused\n"; stderr != want {
			t.Errorf("stderr %q, want %q", stderr, want)
		}
	})
	for kind, addr := range notRedisServers(t) {
		t.Run("not Redis: "+kind, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), "break", "--force", "--redis", addr, "job")
			if code != exitUnavailable || stdout != "" {
				t.Errorf("exit %d, stdout %q; want %d and nothing", code, stdout, exitUnavailable)
			}
			if want := regexp.MustCompile(`^netlock break: ` + regexp.QuoteMeta(addr) + ` does not answer as a Redis server \(redigo: [^)]+\)\n$`); !want.MatchString(stderr) {
				t.Errorf("stderr %q does not match %v", stderr, want)
			}
		})
	}
}

// TestBreakChangedHands: a key that another holder takes during the check
// shows a live lock: break refuses, naming the new token, and leaves it.
func TestBreakChangedHands(t *testing.T) {
	s := redistest.Start(t)
	redisDo(t, s, "SET", lockKey("job"), "r4nd0m:5", "PX", "3000")
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(300 * time.Millisecond) // well inside the check's 1.25s
		if _, err := s.Do("SET", lockKey("job"), "n3wh0ld:6", "PX", "3000"); err != nil {
			t.Errorf("SET of the new holder: %v", err) // not Fatal: another goroutine
		}
	}()
	code, stdout, stderr := runCmd(t, t.Context(), "break", "--redis", s.Addr(), "job")
	<-done
	if code != exitRefused || stdout != "" {
		t.Errorf("exit %d, stdout %q; want %d and nothing", code, stdout, exitRefused)
	}
	if want := regexp.MustCompile(`^netlock break: lock "job" is held by fencing token 6, TTL [0-9.]+m?s, and its holder is alive: the key changed hands in the [0-9.]+m?s between two reads \(now fencing token 6\); `); !want.MatchString(stderr) {
		t.Errorf("stderr %q does not match %v", stderr, want)
	}
	if got := redisDo(t, s, "GET", lockKey("job")); got != "n3wh0ld:6" {
		t.Errorf("the key holds %q, want the new holder's value", got)
	}
}

// TestBreakHelp: break is listed, and its help gives its flags and exit
// codes.
func TestBreakHelp(t *testing.T) {
	code, stdout, _ := runCmd(t, t.Context(), "help")
	if code != exitOK || !strings.Contains(stdout, "\tbreak   end a lock's hold by force") {
		t.Errorf("help: exit %d, and no line for break:\n%s", code, stdout)
	}
	code, stdout, _ = runCmd(t, t.Context(), "break", "--help")
	for _, want := range []string{"Usage: netlock break [flags] NAME", "\n  --force\n", "\n  --check duration\n", "Exit status: 0 broken, or not held", "64 bad usage, or a NetRWMutex or\nSemaphore name; 69"} {
		if code != exitOK || !strings.Contains(stdout, want) {
			t.Errorf("break --help: exit %d, and no %q:\n%s", code, want, stdout)
		}
	}
}

// TestBreakCluster: on a node of a Redis Cluster, whose waiters listen with
// sharded pub/sub, break refuses (64) and leaves the lock held.
func TestBreakCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := redisv9.NewClusterClient(&redisv9.ClusterOptions{Addrs: cluster.Addrs()})
	defer client.Close()
	if err := client.Set(t.Context(), lockKey("job"), "0123456789abcdef0123:7", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	addr := ""
	for _, a := range cluster.Addrs() {
		c := redisv9.NewClient(&redisv9.Options{Addr: a})
		if n, err := c.Exists(t.Context(), lockKey("job")).Result(); err == nil && n == 1 {
			addr = a
		}
		c.Close()
	}
	if addr == "" {
		t.Fatal("no node holds the key")
	}
	code, _, stderr := runCmd(t, t.Context(), "break", "--force", "--redis", addr, "job")
	if code != exitUsage || !strings.Contains(stderr, "is a node of a Redis Cluster: break does not handle a Cluster yet") {
		t.Errorf("break on a Cluster node: exit %d, stderr %q; want %d and the Cluster named", code, stderr, exitUsage)
	}
	if n, _ := client.Exists(t.Context(), lockKey("job")).Result(); n != 1 {
		t.Error("the lock key is gone")
	}
}
