package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// statusRow matches the table row of the node at addr; holder is a
// pattern of the HOLDER column.
func statusRow(addr, state, ttl, token, waiters, counter, holder string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(addr) + `\s+` + state + `\s+` + ttl + `\s+` + token + `\s+` + waiters + `\s+` + counter + `\s+` + holder + `$`)
}

func TestStatusOneNode(t *testing.T) {
	s := redistest.Start(t)
	a := s.Addr()
	status := func(t *testing.T) (int, string, string) {
		t.Helper()
		return runCmd(t, t.Context(), "status", "--redis", a, "job")
	}

	t.Run("never used", func(t *testing.T) {
		code, stdout, stderr := status(t)
		if code != exitFree {
			t.Errorf("exit %d, want %d", code, exitFree)
		}
		if !strings.HasPrefix(stdout, "lock \"job\": free\nNODE ") || !statusRow(a, "free", "-", "-", "0", "0", "-").MatchString(stdout) {
			t.Errorf("stdout does not show job free with fence counter 0:\n%s", stdout)
		}
		if stderr != "" {
			t.Errorf("stderr: got %q, want nothing", stderr)
		}
	})

	redisDo(t, s, "SET", lockKey("job"), "r4nd0m:7", "PX", "50000") // under a minute: TTLs show as seconds
	redisDo(t, s, "SET", fenceKey("job"), "9")
	redisDo(t, s, "ZADD", keyspace.New("netlock:", "job", true).Waiters, "1", "w1", "2", "w2")
	t.Run("held", func(t *testing.T) {
		code, stdout, _ := status(t)
		if code != exitHeld {
			t.Errorf("exit %d, want %d", code, exitHeld)
		}
		ttl := `[1-5]?[0-9](\.[0-9]+)?s`
		if !regexp.MustCompile(`^lock "job": held, fencing token 7, TTL `+ttl+"\n").MatchString(stdout) || !statusRow(a, "held", ttl, "7", "2", "9", "-").MatchString(stdout) {
			t.Errorf("stdout does not show job held with token 7, a TTL up to 50s, 2 waiters and fence counter 9:\n%s", stdout)
		}
		if strings.Contains(stdout, "r4nd0m") {
			t.Errorf("stdout shows the holder's secret value:\n%s", stdout)
		}
	})

	// The holder's identity, as the library escapes it (keyspace.HolderEncode).
	redisDo(t, s, "SET", lockKey("job"), "r4nd0m:7:"+keyspace.HolderEncode("web:1 pid 42"), "PX", "50000")
	t.Run("held with the holder's identity", func(t *testing.T) {
		code, stdout, _ := status(t)
		ttl := `[1-5]?[0-9](\.[0-9]+)?s`
		if code != exitHeld || !regexp.MustCompile(`^lock "job": held, fencing token 7, TTL `+ttl+`, holder "web:1 pid 42"\n`).MatchString(stdout) || !statusRow(a, "held", ttl, "7", "2", "9", "web:1 pid 42").MatchString(stdout) {
			t.Errorf("exit %d, want %d, and job held by web:1 pid 42 in the summary and the row:\n%s", code, exitHeld, stdout)
		}
	})

	redisDo(t, s, "SET", lockKey("job"), "r4nd0m:7")
	redisDo(t, s, "PERSIST", lockKey("job"))
	t.Run("held without TTL", func(t *testing.T) {
		code, stdout, _ := status(t)
		if code != exitHeld || !strings.HasPrefix(stdout, `lock "job": held, fencing token 7, no TTL`+"\n") || !statusRow(a, "held", "none", "7", "2", "9", "-").MatchString(stdout) {
			t.Errorf("exit %d, want %d, and a row with TTL none:\n%s", code, exitHeld, stdout)
		}
	})

	redisDo(t, s, "SET", lockKey("job"), "not netlock's")
	t.Run("foreign value", func(t *testing.T) {
		code, stdout, _ := status(t)
		if code != exitHeld || !strings.HasPrefix(stdout, `lock "job": held, by a key netlock did not write, no TTL`+"\n") || !statusRow(a, "held", "none", `\?`, "2", "9", "-").MatchString(stdout) {
			t.Errorf("exit %d, want %d, and a row with token ?:\n%s", code, exitHeld, stdout)
		}
	})

	redisDo(t, s, "DEL", lockKey("job"))
	redisDo(t, s, "RPUSH", lockKey("job"), "x")
	t.Run("wrong type", func(t *testing.T) {
		code, stdout, stderr := status(t)
		if code != exitUnavailable {
			t.Errorf("exit %d, want %d", code, exitUnavailable)
		}
		if !strings.HasPrefix(stdout, `lock "job": unknown: Redis at `+a+` answered with an error: a key of this lock holds a value of another type, nothing was changed: WRONGTYPE`) || !statusRow(a, "error", "-", "-", "-", "-", "-").MatchString(stdout) {
			t.Errorf("stdout does not show the node's error:\n%s", stdout)
		}
		if !strings.HasPrefix(stderr, "netlock status: "+a+": a key of this lock holds a value of another type") || !strings.Contains(stderr, "WRONGTYPE") {
			t.Errorf("stderr does not report WRONGTYPE from %s: %q", a, stderr)
		}
	})
}

// TestStatusInsideRun runs netlock status as the program of a netlock run:
// it sees the lock held, with the token the program got, by the run's
// process ("<hostname>/<pid>", the pid the program's parent).
func TestStatusInsideRun(t *testing.T) {
	s := redistest.Start(t)
	script := `"$1" status --redis "$2" --prefix app: "$NETLOCK_NAME"; echo "status $? token $NETLOCK_TOKEN"; echo "run $PPID"`
	code, stdout, _ := runNetlock(t, nil, "run", "--redis", s.Addr(), "--prefix", "app:", "--expiry", "30s", "job", "--", "sh", "-c", script, "sh", netlockBin, s.Addr())
	if code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^run ([0-9]+)$`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no pid of the run in:\n%s", stdout)
	}
	holder := host + "/" + m[1]
	if !regexp.MustCompile(`^lock "job": held, fencing token 1, TTL [0-9.]+s, holder `+regexp.QuoteMeta(strconv.Quote(holder))+"\n").MatchString(stdout) || !strings.Contains(stdout, "status 1 token 1\n") {
		t.Errorf("status inside the run does not show the lock held by %s, token 1, exit 1:\n%s", holder, stdout)
	}
	if !statusRow(s.Addr(), "held", `(30|[12][0-9](\.[0-9]+)?)s`, "1", "0", "1", regexp.QuoteMeta(holder)).MatchString(stdout) {
		t.Errorf("no row with the lock held, a TTL up to 30s, fence counter 1 and holder %s:\n%s", holder, stdout)
	}
	code, stdout, _ = runCmd(t, t.Context(), "status", "--redis", s.Addr(), "--prefix", "app:", "job")
	if code != exitFree || !statusRow(s.Addr(), "free", "-", "-", "0", "1", "-").MatchString(stdout) {
		t.Errorf("after the run: exit %d, want %d, and the node free with fence counter 1:\n%s", code, exitFree, stdout)
	}
}

// TestStatusQuorum: over three nodes the lock is held when two hold its key
// with one value, free when fewer do, and unknown when the nodes that did
// not answer could make the difference.
func TestStatusQuorum(t *testing.T) {
	servers := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	args := []string{"status"}
	for _, s := range servers {
		args = append(args, "--redis", s.Addr())
	}
	args = append(args, "job")
	set := func(s *redistest.Server, value string) {
		redisDo(t, s, "SET", lockKey("job"), value, "PX", "60000")
	}
	for _, step := range []struct {
		name    string
		do      func()
		code    int
		summary string
	}{
		{"free", func() {}, exitFree, "free"},
		{"one node", func() { set(servers[0], "a:4") }, exitFree, "free (a key is left on 1 of 3 nodes, but no holder has a quorum of 2)"},
		{"two values", func() { set(servers[1], "b:5") }, exitFree, "free (a key is left on 2 of 3 nodes, but no holder has a quorum of 2)"},
		{"two nodes", func() { set(servers[1], "a:4") }, exitHeld, "held, fencing token 4 on 2 of 3 nodes, TTL "},
		{"two nodes, one down", func() { servers[2].Stop() }, exitHeld, "held, fencing token 4 on 2 of 3 nodes, TTL "},
		{"one node, one down", func() { redisDo(t, servers[1], "DEL", lockKey("job")) }, exitUnavailable, "unknown: 1 of 3 nodes failed, and a quorum of 2 cannot be told without them"},
		{"none, one down", func() { redisDo(t, servers[0], "DEL", lockKey("job")) }, exitFree, "free"},
	} {
		step.do()
		t.Run(step.name, func(t *testing.T) {
			code, stdout, _ := runCmd(t, t.Context(), args...)
			if code != step.code {
				t.Errorf("exit %d, want %d", code, step.code)
			}
			first, _, _ := strings.Cut(stdout, "\n")
			if want := `lock "job": ` + step.summary; first != want && !(strings.HasSuffix(want, "TTL ") && strings.HasPrefix(first, want)) {
				t.Errorf("first line %q, want %q", first, want)
			}
		})
	}
}

func TestStatusBadInput(t *testing.T) {
	t.Setenv(envRedis, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing the lock name"},
		{[]string{"a", "b"}, `unexpected "b" after the lock name`},
		{[]string{"a", "--redis", "x:1"}, `unexpected "--redis" after the lock name: flags go before NAME`},
		{[]string{""}, "empty lock name"},
		{[]string{"}x"}, `lock name "}x" starts with '}'`},
		{[]string{"--prefix", "a{", "x"}, `invalid value "a{" for --prefix: want no '{' or '}'`},
		{[]string{"--redis", "nope:", "a"}, `invalid value "nope:" for --redis: want host or host:port`},
		{[]string{"--wait", "0", "a"}, "unknown flag --wait"},
		{[]string{"--json=maybe", "a"}, `invalid value "maybe" for --json`},
		{[]string{"--kind", "lock", "a"}, `invalid value "lock" for --kind: want mutex, rw, semaphore or once`},
		{[]string{"--kind", "", "a"}, `invalid value "" for --kind: want mutex, rw, semaphore or once`},
		{[]string{"--kind", "rw", ""}, "empty lock name"},
		{[]string{"--kind", "semaphore", "}x"}, `lock name "}x" starts with '}'`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), append([]string{"status"}, tc.args...)...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if stdout != "" {
				t.Errorf("stdout: got %q, want nothing", stdout)
			}
			if first, _, _ := strings.Cut(stderr, "\n"); !strings.HasPrefix(first, "netlock status: ") || !strings.Contains(first, tc.want) || strings.Contains(first, "netlock: ") {
				t.Errorf("stderr's first line %q does not say %q (once netlock)", first, tc.want)
			}
		})
	}
}

// TestStatusNoAuth: a server that wants a password answers status with
// NOAUTH, which status reports as such (not as a node that did not answer),
// with what to do about it.
func TestStatusNoAuth(t *testing.T) {
	s := redistest.Start(t)
	redisDo(t, s, "CONFIG", "SET", "requirepass", "s3cret")
	code, stdout, stderr := runNetlock(t, nil, "status", "--redis", s.Addr(), "job")
	if code != exitUnavailable {
		t.Errorf("exit %d, want %d", code, exitUnavailable)
	}
	if !strings.HasPrefix(stdout, `lock "job": unknown: Redis at `+s.Addr()+` answered with an error: NOAUTH Authentication required`) {
		t.Errorf("stdout does not report NOAUTH:\n%s", stdout)
	}
	if !strings.Contains(stderr, "netlock status: "+s.Addr()+": NOAUTH") || !strings.Contains(stderr, "put it in $NETLOCK_PASSWORD") {
		t.Errorf("stderr does not report NOAUTH with a hint: %q", stderr)
	}
	code, stdout, _ = runNetlock(t, []string{envPassword + "=s3cret"}, "status", "--redis", s.Addr(), "job")
	if code != exitFree || !strings.HasPrefix(stdout, `lock "job": free`) {
		t.Errorf("with the password: exit %d, want %d, and free:\n%s", code, exitFree, stdout)
	}
	code, stdout, _ = runNetlock(t, nil, "status", "--redis", "redis://:s3cret@"+s.Addr(), "job")
	if code != exitFree || !strings.HasPrefix(stdout, `lock "job": free`) || strings.Contains(stdout, "s3cret") {
		t.Errorf("with the password in the URL: exit %d, want %d, free, and no password shown:\n%s", code, exitFree, stdout)
	}
}

// TestStatusJSON checks status --json on a held lock, a free one, and a
// quorum with a node down.
func TestStatusJSON(t *testing.T) {
	servers := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	redisDo(t, servers[0], "SET", lockKey("job"), "r4nd0m:7", "PX", "50000")
	redisDo(t, servers[0], "SET", fenceKey("job"), "9")
	redisDo(t, servers[0], "ZADD", keyspace.New("netlock:", "job", true).Waiters, "1", "w1")
	status := func(t *testing.T, servers ...*redistest.Server) (int, jsonStatus) {
		t.Helper()
		args := []string{"status", "--json"}
		for _, s := range servers {
			args = append(args, "--redis", s.Addr())
		}
		code, stdout, _ := runCmd(t, t.Context(), append(args, "job")...)
		var got jsonStatus
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
		}
		if len(got.Nodes) != len(servers) {
			t.Fatalf("got %d nodes, want %d", len(got.Nodes), len(servers))
		}
		return code, got
	}

	code, got := status(t, servers[0])
	n := got.Nodes[0]
	if code != exitHeld || got.Name != "job" || got.State != "held" || got.Token != 7 || got.TTLMS <= 0 || got.TTLMS > 50000 || len(got.Holder) != 12 {
		t.Errorf("held: exit %d, %+v; want %d, held by token 7 with a TTL up to 50s and a holder", code, got, exitHeld)
	}
	if n.Addr != servers[0].Addr() || n.State != "held" || n.Token != 7 || n.TTLMS != got.TTLMS || n.Holder != got.Holder || n.Waiters != 1 || n.FenceCounter != 9 ||
		n.MaxMemoryPolicy != "noeviction" || n.MaxMemory != 0 || n.Evicts || n.Error != "" {
		t.Errorf("held: node %+v; want the node's detail", n)
	}

	if got.HolderInfo != "" || n.HolderInfo != "" {
		t.Errorf("held by a value without a holder's identity: holder_info %q, node's %q; want none", got.HolderInfo, n.HolderInfo)
	}
	redisDo(t, servers[0], "SET", lockKey("job"), "r4nd0m:7:"+keyspace.HolderEncode("web-1/42"), "PX", "50000")
	_, got = status(t, servers[0])
	if got.HolderInfo != "web-1/42" || got.Nodes[0].HolderInfo != "web-1/42" {
		t.Errorf("holder_info %q, node's %q; want web-1/42", got.HolderInfo, got.Nodes[0].HolderInfo)
	}
	redisDo(t, servers[0], "SET", lockKey("job"), "r4nd0m:7", "PX", "50000")

	code, got = status(t, servers[1])
	if code != exitFree || got.State != "free" || got.Token != 0 || got.TTLMS != 0 || got.Holder != "" || got.Nodes[0].State != "free" {
		t.Errorf("free: exit %d, %+v; want %d and free", code, got, exitFree)
	}

	redisDo(t, servers[1], "SET", lockKey("job"), "r4nd0m:7", "PX", "50000")
	servers[2].Stop()
	code, got = status(t, servers...)
	if code != exitHeld || got.State != "held" || got.Token != 7 || got.Nodes[2].State != "error" || !strings.Contains(got.Nodes[2].Error, "connection refused") || got.Nodes[2].MaxMemory != -1 {
		t.Errorf("quorum, one down: exit %d, %+v; want %d, held, node 2 an error", code, got, exitHeld)
	}
	redisDo(t, servers[1], "DEL", lockKey("job"))
	code, got = status(t, servers...)
	if code != exitUnavailable || got.State != "unknown" || !strings.HasPrefix(got.Error, "cannot tell whether the lock is held") {
		t.Errorf("quorum, one holds, one down: exit %d, %+v; want %d, unknown, and why", code, got, exitUnavailable)
	}
}

// TestStatusMaxmemoryPolicy: status warns about a server that may evict the
// lock's key.
func TestStatusMaxmemoryPolicy(t *testing.T) {
	s := redistest.Start(t)
	redisDo(t, s, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	code, _, stderr := runCmd(t, t.Context(), "status", "--redis", s.Addr(), "job")
	want := "netlock status: warning: " + s.Addr() + " has maxmemory-policy allkeys-lru, which can evict the lock's key under its holder once maxmemory is set (it is not yet); netlock needs noeviction\n"
	if code != exitFree || stderr != want {
		t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, exitFree, want)
	}
	redisDo(t, s, "CONFIG", "SET", "maxmemory-policy", "volatile-ttl", "maxmemory", "100mb")
	_, stdout, stderr := runCmd(t, t.Context(), "status", "--json", "--redis", s.Addr(), "job")
	if !strings.Contains(stderr, "has maxmemory-policy volatile-ttl, which can evict the lock's key under its holder when its 104857600 bytes of maxmemory are full") {
		t.Errorf("stderr does not warn about volatile-ttl: %q", stderr)
	}
	if !strings.Contains(stdout, `"maxmemory_policy": "volatile-ttl"`) || !strings.Contains(stdout, `"evicts": true`) {
		t.Errorf("the JSON does not say the node evicts:\n%s", stdout)
	}
}

// TestStatusUnreachable: status exits 69 when a node it needs refuses
// connections or is not a Redis server, naming it.
func TestStatusUnreachable(t *testing.T) {
	addr := closedPort(t)
	code, stdout, stderr := runCmd(t, t.Context(), "status", "--redis", addr, "job")
	if code != 69 { // EX_UNAVAILABLE, as the help says
		t.Errorf("exit %d, want 69", code)
	}
	if want := `lock "job": unknown: Redis at ` + addr + ` not answering: dial tcp ` + addr + ": connect: connection refused\n"; !strings.HasPrefix(stdout, want) {
		t.Errorf("stdout does not start with %q:\n%s", want, stdout)
	}
	if want := "netlock status: " + addr + ": dial tcp " + addr + ": connect: connection refused\n"; stderr != want {
		t.Errorf("stderr: got %q, want %q", stderr, want)
	}
}
