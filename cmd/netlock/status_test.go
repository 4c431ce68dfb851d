package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/netlock-go/netlock/internal/redistest"
)

// statusRow matches the table row of the node at addr.
func statusRow(addr, state, ttl, token, counter string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(addr) + `\s+` + state + `\s+` + ttl + `\s+` + token + `\s+` + counter + `$`)
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
		if !strings.HasPrefix(stdout, "lock \"job\": free\nNODE ") || !statusRow(a, "free", "-", "-", "0").MatchString(stdout) {
			t.Errorf("stdout does not show job free with fence counter 0:\n%s", stdout)
		}
		if stderr != "" {
			t.Errorf("stderr: got %q, want nothing", stderr)
		}
	})

	redisDo(t, s, "SET", lockKey("job"), "r4nd0m:7", "PX", "50000") // under a minute: TTLs show as seconds
	redisDo(t, s, "SET", fenceKey("job"), "9")
	t.Run("held", func(t *testing.T) {
		code, stdout, _ := status(t)
		if code != exitHeld {
			t.Errorf("exit %d, want %d", code, exitHeld)
		}
		if !strings.HasPrefix(stdout, "lock \"job\": held, fencing token 7\n") || !statusRow(a, "held", `[1-5]?[0-9](\.[0-9]+)?s`, "7", "9").MatchString(stdout) {
			t.Errorf("stdout does not show job held with token 7, a TTL up to 50s and fence counter 9:\n%s", stdout)
		}
		if strings.Contains(stdout, "r4nd0m") {
			t.Errorf("stdout shows the holder's secret value:\n%s", stdout)
		}
	})

	redisDo(t, s, "PERSIST", lockKey("job"))
	t.Run("held without TTL", func(t *testing.T) {
		code, stdout, _ := status(t)
		if code != exitHeld || !statusRow(a, "held", "none", "7", "9").MatchString(stdout) {
			t.Errorf("exit %d, want %d, and a row with TTL none:\n%s", code, exitHeld, stdout)
		}
	})

	redisDo(t, s, "SET", lockKey("job"), "not netlock's")
	t.Run("foreign value", func(t *testing.T) {
		code, stdout, _ := status(t)
		if code != exitHeld || !statusRow(a, "held", "none", `\?`, "9").MatchString(stdout) {
			t.Errorf("exit %d, want %d, and a row with token ?:\n%s", code, exitHeld, stdout)
		}
	})

	redisDo(t, s, "DEL", lockKey("job"))
	redisDo(t, s, "RPUSH", lockKey("job"), "x")
	t.Run("wrong type", func(t *testing.T) {
		code, stdout, stderr := status(t)
		if code != exitUsage {
			t.Errorf("exit %d, want %d", code, exitUsage)
		}
		if !strings.Contains(stdout, `lock "job": unknown: 1 of 1 nodes did not answer`) || !statusRow(a, "error", "-", "-", "-").MatchString(stdout) {
			t.Errorf("stdout does not show the node's error:\n%s", stdout)
		}
		if !strings.Contains(stderr, "netlock status: "+a+": WRONGTYPE") {
			t.Errorf("stderr does not report WRONGTYPE from %s: %q", a, stderr)
		}
	})
}

// TestStatusInsideRun runs netlock status as the program of a netlock run:
// it sees the lock held, with the token the program got.
func TestStatusInsideRun(t *testing.T) {
	s := redistest.Start(t)
	script := `"$1" status --redis "$2" --prefix app: "$NETLOCK_NAME"; echo "status $? token $NETLOCK_TOKEN"`
	code, stdout, _ := runNetlock(t, nil, "run", "--redis", s.Addr(), "--prefix", "app:", "--expiry", "30s", "job", "--", "sh", "-c", script, "sh", netlockBin, s.Addr())
	if code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	if !strings.HasPrefix(stdout, "lock \"job\": held, fencing token 1\n") || !strings.HasSuffix(stdout, "status 1 token 1\n") {
		t.Errorf("status inside the run does not show the lock held by token 1, exit 1:\n%s", stdout)
	}
	if !statusRow(s.Addr(), "held", `(30|[12][0-9](\.[0-9]+)?)s`, "1", "1").MatchString(stdout) {
		t.Errorf("no row with the lock held, a TTL up to 30s and fence counter 1:\n%s", stdout)
	}
	code, stdout, _ = runCmd(t, t.Context(), "status", "--redis", s.Addr(), "--prefix", "app:", "job")
	if code != exitFree || !statusRow(s.Addr(), "free", "-", "-", "1").MatchString(stdout) {
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
		{"two nodes", func() { set(servers[1], "a:4") }, exitHeld, "held, fencing token 4 on 2 of 3 nodes"},
		{"two nodes, one down", func() { servers[2].Stop() }, exitHeld, "held, fencing token 4 on 2 of 3 nodes"},
		{"one node, one down", func() { redisDo(t, servers[1], "DEL", lockKey("job")) }, exitUsage, "unknown: 1 of 3 nodes did not answer"},
		{"none, one down", func() { redisDo(t, servers[0], "DEL", lockKey("job")) }, exitFree, "free"},
	} {
		step.do()
		t.Run(step.name, func(t *testing.T) {
			code, stdout, _ := runCmd(t, t.Context(), args...)
			if code != step.code {
				t.Errorf("exit %d, want %d", code, step.code)
			}
			if first, _, _ := strings.Cut(stdout, "\n"); first != `lock "job": `+step.summary {
				t.Errorf("first line %q, want %q", first, `lock "job": `+step.summary)
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
		{[]string{"--redis", "nope", "a"}, `--redis: "nope" is not host:port`},
		{[]string{"--wait", "0", "a"}, "flag provided but not defined: -wait"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), append([]string{"status"}, tc.args...)...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if stdout != "" {
				t.Errorf("stdout: got %q, want nothing", stdout)
			}
			if first, _, _ := strings.Cut(stderr, "\n"); !strings.HasPrefix(first, "netlock status: ") || !strings.Contains(first, tc.want) {
				t.Errorf("stderr's first line %q does not say %q", first, tc.want)
			}
		})
	}
}
