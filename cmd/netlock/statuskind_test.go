package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// rwStatusRow matches the RW table's row of the node at addr.
func rwStatusRow(addr, state, ttl, token, leases, writers, readers, counter, holder string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(addr) + `\s+` + state + `\s+` + ttl + `\s+` + token + `\s+` + leases + `\s+` + writers + `\s+` + readers + `\s+` + counter + `\s+` + holder + `$`)
}

const anyTTL = `[0-9]+(\.[0-9]+)?(ms|s)`

// TestStatusRW follows a NetRWMutex through status: held by a writer with
// a reader waiting, then by two processes' readers with a writer waiting,
// then free; found by its keys, and with --kind rw.
func TestStatusRW(t *testing.T) {
	s := redistest.Start(t)
	a := s.Addr()
	ctx := t.Context()
	newRW := func(holder string) *netlock.NetRWMutex {
		t.Helper()
		rw, err := netlock.NewRW("catalog", listBackends(t, a), netlock.WithExpiry(30*time.Second), netlock.WithHolderInfo(holder))
		if err != nil {
			t.Fatal(err)
		}
		return rw
	}
	status := func(args ...string) (int, string, string) {
		t.Helper()
		return runCmd(t, ctx, append(append([]string{"status", "--redis", a}, args...), "catalog")...)
	}
	waitFor := func(what, want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, stdout, _ := status()
			if strings.Contains(stdout, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: status does not say %q:\n%s", what, want, stdout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	w := newRW("writer:1")
	if err := w.LockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	r1 := newRW("reader-1")
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rerr := make(chan error, 1)
	go func() { rerr <- r1.RLockCtx(rctx) }()
	waitFor("the reader waits", "waiting: 0 writers, 1 reader")
	code, stdout, stderr := status()
	token := strconv.FormatUint(w.Token(), 10)
	if want := `rw lock "catalog": held by a writer, fencing token ` + token + `, TTL ` + anyTTL + `, holder "writer:1"; waiting: 0 writers, 1 reader` + "\n"; code != exitHeld || !regexp.MustCompile("^"+want).MatchString(stdout) {
		t.Errorf("a writer: exit %d, want %d, and a first line matching %q:\n%s", code, exitHeld, want, stdout)
	}
	if !rwStatusRow(a, "write", anyTTL, token, "0", "0", "1", token, "writer:1").MatchString(stdout) || stderr != "" {
		t.Errorf("a writer: no row with the writer's hold, or stderr %q:\n%s", stderr, stdout)
	}
	if err := w.UnlockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-rerr; err != nil {
		t.Fatal(err)
	}

	r2 := newRW("reader-2")
	if err := r2.RLockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	w2 := newRW("writer-2")
	werr := make(chan error, 1)
	go func() { werr <- w2.LockCtx(rctx) }()
	waitFor("the writer waits", "waiting: 1 writer, 0 readers")
	code, stdout, _ = status("--kind", "rw")
	if want := `^rw lock "catalog": held by readers on 2 read leases, holders "reader-[12]", "reader-[12]"; waiting: 1 writer, 0 readers` + "\n"; code != exitHeld || !regexp.MustCompile(want).MatchString(stdout) {
		t.Errorf("two readers: exit %d, want %d, and a first line matching %q:\n%s", code, exitHeld, want, stdout)
	}
	if !rwStatusRow(a, "read", anyTTL, "-", "2", "1", "0", token, "reader-[12],reader-[12]").MatchString(stdout) {
		t.Errorf("two readers: no row with the two leases:\n%s", stdout)
	}

	code, stdout, _ = status("--json")
	var got jsonRWStatus
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	if code != exitHeld || got.Kind != "rw" || got.State != "held" || got.Writer || len(got.Readers) != 2 || len(got.Nodes) != 1 {
		t.Fatalf("--json, two readers: exit %d, %+v; want %d, held by two readers", code, got, exitHeld)
	}
	n := got.Nodes[0]
	if n.State != "read" || len(n.Leases) != 2 || n.WriteWaiters != 1 || n.ReadWaiters != 0 || n.Addr != a || len(got.Readers[0].Holder) != 12 || got.Readers[0].TTLMS <= 0 {
		t.Errorf("--json, two readers: node %+v, readers %+v", n, got.Readers)
	}
	if !strings.HasPrefix(got.Readers[0].HolderInfo, "reader-") || !strings.HasPrefix(got.Readers[1].HolderInfo, "reader-") {
		t.Errorf("--json, two readers: holders %+v", got.Readers)
	}

	for _, r := range []*netlock.NetRWMutex{r1, r2} {
		if err := r.RUnlockCtx(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if err := w2.UnlockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	// No keys left: a free name, shown as a NetMutex unless --kind says.
	if code, stdout, _ := status(); code != exitFree || !strings.HasPrefix(stdout, `lock "catalog": free`+"\n") {
		t.Errorf("free: exit %d, want %d, and free:\n%s", code, exitFree, stdout)
	}
	if code, stdout, _ := status("--kind", "rw"); code != exitFree || !strings.HasPrefix(stdout, `rw lock "catalog": free`+"\n") || !rwStatusRow(a, "free", "-", "-", "0", "0", "0", `[0-9]+`, "-").MatchString(stdout) {
		t.Errorf("free, --kind rw: exit %d, want %d, and free:\n%s", code, exitFree, stdout)
	}

	redisDo(t, s, "RPUSH", keyspace.RW("netlock:", "catalog", false).Writer, "x")
	code, stdout, stderr = status("--kind", "rw")
	if code != exitUnavailable || !strings.HasPrefix(stdout, `rw lock "catalog": unknown: Redis at `+a+` answered with an error: `) || !rwStatusRow(a, "error", "-", "-", "-", "-", "-", "-", "-").MatchString(stdout) {
		t.Errorf("wrong type: exit %d, want %d, and the node's error:\n%s", code, exitUnavailable, stdout)
	}
	if !strings.HasPrefix(stderr, "netlock status: "+a+": ") || !strings.Contains(stderr, "WRONGTYPE") {
		t.Errorf("wrong type: stderr %q does not report WRONGTYPE", stderr)
	}
}

// TestStatusSemaphore shows a Semaphore held by two processes, one
// waiting, then free; a Semaphore over several --redis is refused.
func TestStatusSemaphore(t *testing.T) {
	s := redistest.Start(t)
	a := s.Addr()
	ctx := t.Context()
	var sems []*netlock.Semaphore
	for _, holder := range []string{"pay-0", "pay-1", "pay-2"} {
		sem, err := netlock.NewSemaphore("payments", 3, listBackends(t, a), netlock.WithHolderInfo(holder))
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, sem)
	}
	if err := sems[0].Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := sems[1].Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	aerr := make(chan error, 1)
	go func() { aerr <- sems[2].Acquire(actx, 1) }()
	deadline := time.Now().Add(10 * time.Second)
	var code int
	var stdout, stderr string
	for {
		code, stdout, stderr = runCmd(t, ctx, "status", "--redis", a, "payments")
		if strings.Contains(stdout, "waiting") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := `semaphore "payments": held, 3 of 3 permits out, on 2 leases, holders "pay-[01]", "pay-[01]"; waiting: 1 process` + "\n"
	if code != exitHeld || !regexp.MustCompile("^"+want).MatchString(stdout) || stderr != "" {
		t.Errorf("held: exit %d, stderr %q; want %d, nothing, and a first line matching %q:\n%s", code, stderr, exitHeld, want, stdout)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(a) + `\s+held\s+3\s+3\s+2\s+1\s+pay-[01],pay-[01]$`).MatchString(stdout) {
		t.Errorf("held: no row with size 3, 3 out, 2 leases, 1 waiting:\n%s", stdout)
	}
	code, stdout, _ = runCmd(t, ctx, "status", "--json", "--kind", "semaphore", "--redis", a, "payments")
	var got jsonSemStatus
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	if code != exitHeld || got.Kind != "semaphore" || got.State != "held" || got.Addr != a || got.Size != 3 || got.Permits != 3 || got.Leases != 2 || got.Waiters != 1 || len(got.Holders) != 2 {
		t.Errorf("--json: exit %d, %+v; want %d, held, size 3, 3 out, 2 leases, 1 waiting", code, got, exitHeld)
	}

	cancel()
	<-aerr
	for i, n := range []int64{2, 1} {
		if err := sems[i].ReleaseCtx(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	code, stdout, _ = runCmd(t, ctx, "status", "--kind", "semaphore", "--redis", a, "payments")
	if code != exitFree || !strings.HasPrefix(stdout, `semaphore "payments": free`+"\n") {
		t.Errorf("free: exit %d, want %d, and free:\n%s", code, exitFree, stdout)
	}

	code, stdout, stderr = runCmd(t, ctx, "status", "--kind", "semaphore", "--redis", a, "--redis", redistest.Start(t).Addr(), "payments")
	if code != exitUsage || stdout != "" || !strings.HasPrefix(stderr, `netlock status: semaphore "payments": 2 backends; a Semaphore runs on one`) {
		t.Errorf("two --redis: exit %d, stdout %q, stderr %q; want %d and why", code, stdout, stderr, exitUsage)
	}
}

// TestStatusKind: a NetMutex and a NetRWMutex of one name are different
// locks; with keys of both, status refuses to guess, and --kind picks one.
func TestStatusKind(t *testing.T) {
	s := redistest.Start(t)
	a := s.Addr()
	redisDo(t, s, "SET", lockKey("job"), "v:3:m", "PX", "50000")
	redisDo(t, s, "SET", keyspace.RW("netlock:", "job", false).Writer, "v:4:w", "PX", "50000")
	code, stdout, stderr := runCmd(t, t.Context(), "status", "--redis", a, "job")
	want := `netlock status: "job" has the keys of a NetMutex and a NetRWMutex, different locks of one name: give --kind mutex or --kind rw` + "\n"
	if code != exitUsage || stdout != "" || !strings.HasPrefix(stderr, want) {
		t.Errorf("two kinds: exit %d, stdout %q, stderr %q; want %d and %q", code, stdout, stderr, exitUsage, want)
	}
	for _, c := range []struct{ kind, first string }{
		{"mutex", `lock "job": held, fencing token 3, TTL ` + anyTTL + `, holder "m"`},
		{"rw", `rw lock "job": held by a writer, fencing token 4, TTL ` + anyTTL + `, holder "w"`},
		{"semaphore", `semaphore "job": free`},
	} {
		code, stdout, _ := runCmd(t, t.Context(), "status", "--kind", c.kind, "--redis", a, "job")
		if wantCode := map[bool]int{true: exitFree, false: exitHeld}[c.kind == "semaphore"]; code != wantCode || !regexp.MustCompile("^"+c.first+"\n").MatchString(stdout) {
			t.Errorf("--kind %s: exit %d, want %d, and a first line matching %q:\n%s", c.kind, code, wantCode, c.first, stdout)
		}
	}
	redisDo(t, s, "DEL", lockKey("job"))
	if code, stdout, _ := runCmd(t, t.Context(), "status", "--redis", a, "job"); code != exitHeld || !strings.HasPrefix(stdout, `rw lock "job": held by a writer`) {
		t.Errorf("only the NetRWMutex's keys: exit %d, want %d, and the writer:\n%s", code, exitHeld, stdout)
	}
}
