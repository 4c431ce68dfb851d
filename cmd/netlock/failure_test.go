package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// notRedisServers starts, on loopback, two servers that are not Redis: an
// HTTP server and one that greets every connection with a line of its own
// protocol, as SSH does. It returns their addresses by name.
func notRedisServers(t *testing.T) map[string]string {
	t.Helper()
	web := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(web.Close)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				io.WriteString(c, "SSH-2.0-OpenSSH_9.6\r\n")
				io.Copy(io.Discard, c)
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return map[string]string{"http": strings.TrimPrefix(web.URL, "http://"), "greeting": l.Addr().String()}
}

// TestNotRedisServer: a --redis address where something other than Redis
// listens is named as such, with exit 69; run says so before it would wait.
func TestNotRedisServer(t *testing.T) {
	for kind, addr := range notRedisServers(t) {
		t.Run(kind, func(t *testing.T) {
			notRedis := regexp.QuoteMeta(addr) + ` does not answer as a Redis server \((redigo|rueidis|go-redis): [^)]+\)`

			start := time.Now()
			code, stdout, stderr := runNetlock(t, nil, "run", "--redis", addr, "--wait", "30s", "job", "--", "echo", "ran")
			if code != exitUnavailable || stdout != "" {
				t.Errorf("run: exit %d, stdout %q; want %d and nothing", code, stdout, exitUnavailable)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("run: took %v, want it to say so without waiting for --wait 30s", took)
			}
			if want := regexp.MustCompile(`^netlock run: cannot take the lock "job": ` + notRedis + "\n$"); !want.MatchString(stderr) {
				t.Errorf("run: stderr %q does not match %v", stderr, want)
			}

			code, stdout, stderr = runCmd(t, t.Context(), "status", "--redis", addr, "job")
			if code != exitUnavailable {
				t.Errorf("status: exit %d, want %d", code, exitUnavailable)
			}
			if want := regexp.MustCompile(`^lock "job": unknown: ` + notRedis + "\n"); !want.MatchString(stdout) {
				t.Errorf("status: stdout %q does not match %v", stdout, want)
			}
			if strings.Contains(stdout+stderr, "possible server error") {
				t.Errorf("status: the output blames the server or the application: %q", stdout+stderr)
			}

			for _, backend := range backendNames {
				code, _, stderr := runCmd(t, t.Context(), "demo", "--redis", addr, "--backend", backend)
				if want := regexp.MustCompile(`^netlock demo: ` + notRedis + "\n$"); code != exitUnavailable || !want.MatchString(stderr) {
					t.Errorf("demo --backend %s: exit %d, stderr %q; want %d and a match for %v", backend, code, stderr, exitUnavailable, want)
				}
			}
		})
	}
}

// TestNotRedisNodeOfQuorum: one node of three that is not Redis leaves a
// quorum: run takes the lock on the other two, and status tells of it.
func TestNotRedisNodeOfQuorum(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	other := notRedisServers(t)["greeting"]
	args := []string{"--redis", a.Addr(), "--redis", b.Addr(), "--redis", other}
	code, stdout, _ := runNetlock(t, nil, append(append([]string{"run"}, args...), "job", "--", "echo", "ran")...)
	if code != 0 || stdout != "ran\n" {
		t.Errorf("run: exit %d, stdout %q; want 0 and the program's output", code, stdout)
	}
	code, _, stderr := runCmd(t, t.Context(), append(append([]string{"status"}, args...), "job")...)
	if want := "netlock status: node 2 " + other + ": does not answer as a Redis server (redigo: "; code != exitFree || !strings.HasPrefix(stderr, want) {
		t.Errorf("status: exit %d, stderr %q; want %d and %q", code, stderr, exitFree, want)
	}
}
