package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/redistest"
)

// newElection returns an Election called name on s, with a client of its
// own, closed when the test ends.
func newElection(t *testing.T, s *redistest.Server, name string) *netlock.Election {
	t.Helper()
	pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", s.Addr())
	}}
	t.Cleanup(func() { pool.Close() })
	e, err := netlock.NewElection(name, []netlock.Backend{netlock.NewRedigo(pool)})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestLeader(t *testing.T) {
	s := redistest.Start(t)
	leader := func(t *testing.T, args ...string) (int, string, string) {
		t.Helper()
		return runCmd(t, t.Context(), append([]string{"leader", "--redis", s.Addr()}, args...)...)
	}
	if code, stdout, stderr := leader(t, "jobs"); code != exitNoLeader || stdout != "election \"jobs\": no leader\n" || stderr != "" {
		t.Errorf("nobody leading: got exit %d, stdout %q, stderr %q; want %d and no leader", code, stdout, stderr, exitNoLeader)
	}
	e := newElection(t, s, "jobs")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Campaign(ctx, "10.0.0.1:80"); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("election \"jobs\": leader \"10.0.0.1:80\", term %d\n", e.Term())
	if code, stdout, _ := leader(t, "jobs"); code != exitOK || stdout != want {
		t.Errorf("leading: got exit %d, stdout %q; want %d and %q", code, stdout, exitOK, want)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args   []string
		code   int
		errOut string
	}{
		{nil, exitUsage, "missing the lock name"},
		{[]string{"a", "b"}, exitUsage, `unexpected "b"`},
		{[]string{"--watch=maybe", "a"}, exitUsage, "--watch"},
		{[]string{"}x"}, exitUsage, "starts with '}'"},
	} {
		if code, _, stderr := leader(t, tc.args...); code != tc.code || !strings.Contains(stderr, tc.errOut) {
			t.Errorf("leader %v: got exit %d, stderr %q; want %d and %q", tc.args, code, stderr, tc.code, tc.errOut)
		}
	}
	code, _, stderr := runCmd(t, t.Context(), "leader", "--redis", "127.0.0.1:1", "jobs")
	if code != exitUnavailable || stderr == "" {
		t.Errorf("Redis out of reach: got exit %d, stderr %q; want %d and the error", code, stderr, exitUnavailable)
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// --watch prints the leader now, then each change, until interrupted.
func TestLeaderWatch(t *testing.T) {
	s := redistest.Start(t)
	e := newElection(t, s, "jobs")
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut lockedBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"leader", "--redis", s.Addr(), "--watch", "jobs"}, &out, &errOut) }()
	waitFor := func(line string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), line) {
			if time.Now().After(deadline) {
				t.Fatalf("no line %q within 10s; stdout:\n%s\nstderr:\n%s", line, out.String(), errOut.String())
			}
			time.Sleep(10 * time.Millisecond) // between looks at the output, not an ordering
		}
	}
	waitFor("election \"jobs\": no leader\n")
	if err := e.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	waitFor(fmt.Sprintf("election \"jobs\": leader \"a\", term %d\n", e.Term()))
	if err := e.Proclaim(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	term := e.Term()
	waitFor(fmt.Sprintf("election \"jobs\": leader \"b\", term %d\n", term))
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(fmt.Sprintf("leader \"b\", term %d\nelection \"jobs\": no leader\n", term))
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("watch interrupted: exit %d, want %d", code, exitOK)
	}
}
