package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	redisv9 "github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// listBackends returns a netlock backend of its own on addr: each holder
// in these tests is another client.
func listBackends(t *testing.T, addr string) []netlock.Backend {
	t.Helper()
	pool := &redis.Pool{MaxIdle: 4, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	t.Cleanup(func() { pool.Close() })
	return []netlock.Backend{netlock.NewRedigo(pool)}
}

// listJSON runs "netlock list --json" with args and parses its output.
func listJSON(t *testing.T, wantCode int, args ...string) []listRow {
	t.Helper()
	code, stdout, _ := runCmd(t, t.Context(), append([]string{"list", "--json"}, args...)...)
	if code != wantCode {
		t.Fatalf("exit %d, want %d", code, wantCode)
	}
	var rows []listRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, stdout)
	}
	if rows == nil {
		t.Fatalf("--json printed %q, want an array", stdout)
	}
	return rows
}

// byNameKind indexes rows by "name kind".
func byNameKind(rows []listRow) map[string]listRow {
	m := map[string]listRow{}
	for _, r := range rows {
		m[r.Name+" "+r.Kind] = r
	}
	return m
}

func tokenOf(r listRow) string {
	if r.Token == nil {
		return "null"
	}
	return strconv.FormatUint(*r.Token, 10)
}

// TestListHeld holds one lock of every kind through the library on a real
// Redis and lists them: each appears once with its kind, token, TTL, count
// and holders; queues, tombstones and fence counters do not; released ones
// go.
func TestListHeld(t *testing.T) {
	s := redistest.Start(t)
	a := s.Addr()
	ctx := t.Context()
	opts := []netlock.Option{netlock.WithExpiry(30 * time.Second)}
	as := func(holder string) []netlock.Option {
		return append(opts[:len(opts):len(opts)], netlock.WithHolderInfo(holder))
	}
	host, _ := os.Hostname()
	self := host + "/" + strconv.Itoa(os.Getpid()) // the default

	// Each byte the keys' values are split on, in the identity.
	m, err := netlock.New("orders", listBackends(t, a), as("web:1 +#%/x")...)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.LockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := netlock.NewRW("catalog", listBackends(t, a), opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.LockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	var readers []*netlock.NetRWMutex
	for i := range 2 { // two objects, two processes' leases
		r, err := netlock.NewRW("prices", listBackends(t, a), as(fmt.Sprintf("reader-%d", i))...)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.RLockCtx(ctx); err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	var sems []*netlock.Semaphore
	for i := range 2 { // one permit each, from two processes
		sem, err := netlock.NewSemaphore("payments", 3, listBackends(t, a), as(fmt.Sprintf("pay-%d", i))...)
		if err != nil {
			t.Fatal(err)
		}
		if err := sem.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		sems = append(sems, sem)
	}
	// Not locks: a queue with no holder, a tombstone, a fence counter.
	redisDo(t, s, "ZADD", keyspace.New("netlock:", "queued", true).Waiters, "1", "w1")
	redisDo(t, s, "SET", keyspace.Tomb(lockKey("gone"), "v1"), "1", "PX", "60000")
	redisDo(t, s, "SET", fenceKey("gone"), "4")

	rows := listJSON(t, exitOK, "--redis", a)
	got := byNameKind(rows)
	want := []struct {
		key, token      string
		leases, permits int
		holders         []string
	}{
		{"orders mutex", strconv.FormatUint(m.Token(), 10), 0, 0, []string{"web:1 +#%/x"}},
		{"catalog rw-write", strconv.FormatUint(w.Token(), 10), 0, 0, []string{self}},
		{"prices rw-read", "null", 2, 0, []string{"reader-0", "reader-1"}},
		{"payments semaphore", "null", 2, 2, []string{"pay-0", "pay-1"}},
	}
	if len(rows) != len(want) {
		t.Errorf("%d rows, want %d: %+v", len(rows), len(want), rows)
	}
	for _, w := range want {
		r, ok := got[w.key]
		switch {
		case !ok:
			t.Errorf("no row for %s", w.key)
		case tokenOf(r) != w.token || r.Foreign || r.Leases != w.leases || r.Permits != w.permits || r.Node != a:
			t.Errorf("%s: %+v token %s; want token %s, leases %d, permits %d on %s", w.key, r, tokenOf(r), w.token, w.leases, w.permits, a)
		case r.TTLMS <= 0 || r.TTLMS > 30000:
			t.Errorf("%s: ttl_ms %d, want 1 to 30000", w.key, r.TTLMS)
		case !slices.Equal(sorted(r.Holders), w.holders):
			t.Errorf("%s: holders %q, want %q", w.key, r.Holders, w.holders)
		}
	}
	if r := got["payments semaphore"]; r.Size != 3 {
		t.Errorf("payments: size %d, want 3", r.Size)
	}
	if m.Token() == 0 || w.Token() == 0 {
		t.Errorf("tokens %d and %d: want fencing on", m.Token(), w.Token())
	}
	names := []string{}
	for _, r := range rows {
		names = append(names, r.Name)
	}
	if strings.Join(names, ",") != "catalog,orders,payments,prices" {
		t.Errorf("rows in the order %v, want sorted by name", names)
	}

	code, stdout, stderr := runCmd(t, ctx, "list", "--redis", a)
	table := []string{
		`NAME +KIND +TOKEN +TTL +HELD +HOLDER`,
		`catalog +rw-write +` + strconv.FormatUint(w.Token(), 10) + ` +[0-9][0-9.ms]* +1 +` + regexp.QuoteMeta(self),
		`orders +mutex +` + strconv.FormatUint(m.Token(), 10) + ` +[0-9][0-9.ms]* +1 +` + regexp.QuoteMeta("web:1 +#%/x"),
		`payments +semaphore +- +[0-9][0-9.ms]* +2/3 permits +(pay-0,pay-1|pay-1,pay-0)`,
		`prices +rw-read +- +[0-9][0-9.ms]* +2 leases +(reader-0,reader-1|reader-1,reader-0)`,
	}
	if want := regexp.MustCompile(`^` + strings.Join(table, "\n") + "\n$"); code != exitOK || !want.MatchString(stdout) || stderr != "" {
		t.Errorf("table: exit %d, stderr %q, stdout does not match %v:\n%s", code, stderr, want, stdout)
	}
	if strings.Contains(stdout, "NODE") {
		t.Errorf("one node, yet a NODE column:\n%s", stdout)
	}

	// Released, one by one.
	if err := m.UnlockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	if err := readers[0].RUnlockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sems[0].ReleaseCtx(ctx, 1); err != nil {
		t.Fatal(err)
	}
	got = byNameKind(listJSON(t, exitOK, "--redis", a))
	if _, ok := got["orders mutex"]; ok {
		t.Errorf("orders still listed after Unlock")
	}
	if r := got["prices rw-read"]; r.Leases != 1 || !slices.Equal(r.Holders, []string{"reader-1"}) {
		t.Errorf("prices after one RUnlock: %+v, want 1 lease, of reader-1", r)
	}
	if r := got["payments semaphore"]; r.Permits != 1 || r.Leases != 1 || !slices.Equal(r.Holders, []string{"pay-1"}) {
		t.Errorf("payments after one Release: %+v, want 1 permit out, to pay-1", r)
	}
	if err := w.UnlockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	if err := readers[1].RUnlockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sems[1].ReleaseCtx(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if rows := listJSON(t, exitOK, "--redis", a); len(rows) != 0 {
		t.Errorf("after every release: %+v, want none", rows)
	}
	code, stdout, _ = runCmd(t, ctx, "list", "--redis", a)
	if code != exitOK || stdout != "NAME  KIND  TOKEN  TTL  HELD  HOLDER\n" {
		t.Errorf("empty table: exit %d, stdout %q", code, stdout)
	}
}

// sorted returns a sorted copy of s.
func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestListForeign: a lock key netlock did not write (another value, or
// another type) holds the lock as far as netlock goes: it is listed as
// foreign, token ?.
func TestListForeign(t *testing.T) {
	s := redistest.Start(t)
	redisDo(t, s, "SET", lockKey("text"), "not netlock's")
	redisDo(t, s, "RPUSH", lockKey("list"), "x")
	redisDo(t, s, "SET", keyspace.RW("netlock:", "plain", true).Writer, "v:0", "PX", "60000") // fencing off: token 0
	got := byNameKind(listJSON(t, exitOK, "--redis", s.Addr()))
	for _, name := range []string{"text", "list"} {
		if r, ok := got[name+" mutex"]; !ok || !r.Foreign || r.Token != nil || r.TTLMS != -1 {
			t.Errorf("%s: %+v (listed %v), want foreign, token null, no TTL", name, r, ok)
		}
	}
	if r := got["plain rw-write"]; r.Foreign || tokenOf(r) != "0" || r.TTLMS <= 0 {
		t.Errorf("plain: %+v, want token 0 and a TTL", r)
	}
	code, stdout, _ := runCmd(t, t.Context(), "list", "--redis", s.Addr())
	if !regexp.MustCompile(`(?m)^list +mutex +\? +none +1 +-$`).MatchString(stdout) || code != exitOK {
		t.Errorf("exit %d; no row for list with token ? and TTL none:\n%s", code, stdout)
	}
}

// TestListPrefix: --prefix lists the locks under that prefix only.
func TestListPrefix(t *testing.T) {
	s := redistest.Start(t)
	ctx := t.Context()
	for _, p := range []string{"netlock:", "app:", "app:x:"} {
		m, err := netlock.New("job", listBackends(t, s.Addr()), netlock.WithPrefix(p))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.LockCtx(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.UnlockCtx(context.Background()) })
	}
	// A prefix with glob characters is matched as it is.
	redisDo(t, s, "SET", "a*b:{star}", "v:1", "PX", "60000")
	redisDo(t, s, "SET", "aXb:{other}", "v:1", "PX", "60000")
	for _, tc := range []struct {
		prefix string
		want   int
	}{{"netlock:", 1}, {"app:", 1}, {"app:x:", 1}, {"nothing:", 0}, {"a*b:", 1}} {
		rows := listJSON(t, exitOK, "--redis", s.Addr(), "--prefix", tc.prefix)
		if len(rows) != tc.want {
			t.Errorf("--prefix %s: %+v, want %d rows", tc.prefix, rows, tc.want)
		}
		if tc.prefix == "a*b:" && len(rows) == 1 && rows[0].Name != "star" {
			t.Errorf("--prefix a*b: lists %q, want star only", rows[0].Name)
		}
	}
}

// TestListLimit: with more keys under the prefix than --limit, list stops
// there, says so and exits with 1.
func TestListLimit(t *testing.T) {
	s := redistest.Start(t)
	for i := range 25 {
		redisDo(t, s, "SET", lockKey(fmt.Sprintf("job%02d", i)), "v:1", "PX", "60000")
	}
	code, stdout, stderr := runCmd(t, t.Context(), "list", "--redis", s.Addr(), "--limit", "10")
	if code != exitTruncated {
		t.Errorf("exit %d, want %d", code, exitTruncated)
	}
	if want := `netlock list: stopped at --limit 10 keys under the prefix "netlock:": there are more, and locks among them are not listed; raise --limit or narrow --prefix` + "\n"; stderr != want {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
	if n := strings.Count(stdout, "\n") - 1; n > 10 || n < 1 {
		t.Errorf("%d rows, want 1 to 10:\n%s", n, stdout)
	}
	rows := listJSON(t, exitTruncated, "--redis", s.Addr(), "--limit", "24")
	if len(rows) > 24 {
		t.Errorf("--limit 24: %d rows", len(rows))
	}
	if rows := listJSON(t, exitOK, "--redis", s.Addr(), "--limit", "25"); len(rows) != 25 {
		t.Errorf("--limit 25: %d rows, want all 25", len(rows))
	}
}

// TestListBadInput: bad flags and arguments exit 64 before Redis is asked;
// a server out of reach or not Redis, 69.
func TestListBadInput(t *testing.T) {
	unused := closedPort(t) // nothing is dialled for usage errors
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nope"}, "unknown flag --nope"},
		{[]string{"--prefix", ""}, `invalid value "" for --prefix: want the prefix of netlock's keys`},
		{[]string{"--prefix", "a{"}, `invalid value "a{" for --prefix: want no '{' or '}'`},
		{[]string{"--limit", "0"}, `invalid value "0" for --limit: want a whole number from 1 up`},
		{[]string{"--limit", "x"}, `invalid value "x" for --limit`},
		{[]string{"job"}, `unexpected "job": list takes no arguments`},
		{[]string{"--redis", "nohost:"}, `invalid value "nohost:" for --redis`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), append([]string{"list", "--redis", unused}, tc.args...)...)
			if code != exitUsage || stdout != "" || !strings.HasPrefix(stderr, "netlock list: "+tc.want) || !strings.HasSuffix(stderr, "Run \"netlock list --help\" for usage.\n") {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d and %q", code, stdout, stderr, exitUsage, tc.want)
			}
		})
	}

	// No node listed: nothing on stdout, which would read as "no locks".
	t.Run("unreachable", func(t *testing.T) {
		want := "netlock list: Redis at " + unused + " not answering: dial tcp " + unused + ": connect: connection refused\n"
		for _, args := range [][]string{{"list", "--redis", unused}, {"list", "--json", "--redis", unused}} {
			code, stdout, stderr := runCmd(t, t.Context(), args...)
			if code != exitUnavailable || stderr != want || stdout != "" {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, nothing and %q", args, code, stdout, stderr, exitUnavailable, want)
			}
		}
	})
	for kind, addr := range notRedisServers(t) {
		t.Run("not redis "+kind, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), "list", "--redis", addr)
			want := regexp.MustCompile(`^netlock list: ` + regexp.QuoteMeta(addr) + ` does not answer as a Redis server \(redigo: [^)]+\)` + "\n$")
			if code != exitUnavailable || !want.MatchString(stderr) || stdout != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, nothing and a match for %v", code, stdout, stderr, exitUnavailable, want)
			}
		})
	}
	t.Run("one node of two out of reach", func(t *testing.T) {
		s := redistest.Start(t)
		redisDo(t, s, "SET", lockKey("job"), "v:3", "PX", "60000")
		code, stdout, stderr := runCmd(t, t.Context(), "list", "--redis", s.Addr(), "--redis", unused)
		if code != exitUnavailable || !regexp.MustCompile(`(?m)^job +mutex +3 +[0-9][0-9.ms]* +1 +`+regexp.QuoteMeta(s.Addr())+` +-$`).MatchString(stdout) ||
			!strings.Contains(stderr, "Redis at "+unused+" not answering") {
			t.Errorf("exit %d, stdout %q, stderr %q; want %d, job listed on %s with a NODE column, and %s named", code, stdout, stderr, exitUnavailable, s.Addr(), unused)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		s := redistest.Start(t, "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all")
		code, _, stderr := runCmd(t, t.Context(), "list", "--redis", "redis://alice:guess@"+s.Addr())
		if code != exitUnavailable || !strings.Contains(stderr, "answered with an error: WRONGPASS") || !strings.Contains(stderr, "refused the user or password") {
			t.Errorf("exit %d, stderr %q; want %d, WRONGPASS and the hint", code, stderr, exitUnavailable)
		}
		if code, stdout, _ := runCmd(t, t.Context(), "list", "--redis", "redis://alice:s3cret@"+s.Addr()); code != exitOK || stdout == "" {
			t.Errorf("with the password: exit %d, stdout %q; want %d and a table", code, stdout, exitOK)
		}
	})
}

// TestListMiniredis: on miniredis, which answers INFO cluster with an
// error, list reads the one server.
func TestListMiniredis(t *testing.T) {
	srv := miniredis.RunT(t)
	m, err := netlock.New("job", listBackends(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.LockCtx(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer m.UnlockCtx(context.Background())
	rows := listJSON(t, exitOK, "--redis", srv.Addr())
	if len(rows) != 1 || rows[0].Name != "job" || rows[0].Kind != kindMutex || tokenOf(rows[0]) != strconv.FormatUint(m.Token(), 10) {
		t.Errorf("%+v, want job held with token %d", rows, m.Token())
	}
}

// TestListCluster: given one node of a Redis Cluster, list lists the
// locks on every master.
func TestListCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := redisv9.NewClusterClient(&redisv9.ClusterOptions{Addrs: cluster.Addrs()})
	defer client.Close()
	slots := map[string]bool{}
	for i := range 30 {
		name := fmt.Sprintf("job%02d", i)
		if err := client.Set(t.Context(), lockKey(name), "v:"+strconv.Itoa(i+1), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		slots[name] = true
	}
	rows := listJSON(t, exitOK, "--redis", cluster.Addrs()[1])
	nodes := map[string]int{}
	for _, r := range rows {
		if !slots[r.Name] || r.Kind != kindMutex {
			t.Errorf("unexpected row %+v", r)
		}
		nodes[r.Node]++
	}
	if len(rows) != 30 || len(nodes) != 3 {
		t.Errorf("%d rows on %d nodes (%v), want 30 on 3", len(rows), len(nodes), nodes)
	}
}

// TestListElection: an Election's leader holds a lock of its own, listed
// with its term as the token and its holder's identity; once it resigns,
// nothing is listed.
func TestListElection(t *testing.T) {
	s := redistest.Start(t)
	a := s.Addr()
	e, err := netlock.NewElection("scheduler", listBackends(t, a), netlock.WithExpiry(30*time.Second), netlock.WithHolderInfo("sched-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Campaign(t.Context(), "10.0.0.1:8080"); err != nil {
		t.Fatal(err)
	}
	rows := listJSON(t, exitOK, "--redis", a)
	if len(rows) != 1 {
		t.Fatalf("got %+v, want one row", rows)
	}
	r := rows[0]
	if r.Name != "scheduler" || r.Kind != kindElect || tokenOf(r) != strconv.FormatUint(e.Term(), 10) || r.TTLMS <= 0 || r.TTLMS > 30000 || !slices.Equal(r.Holders, []string{"sched-1"}) {
		t.Errorf("got %+v token %s, want scheduler, election, term %d, a TTL up to 30s, holder sched-1", r, tokenOf(r), e.Term())
	}
	code, stdout, _ := runCmd(t, t.Context(), "list", "--redis", a)
	if want := regexp.MustCompile(`(?m)^scheduler +election +` + strconv.FormatUint(e.Term(), 10) + ` +[0-9][0-9.ms]* +1 +sched-1$`); code != exitOK || !want.MatchString(stdout) {
		t.Errorf("table: exit %d, no row matching %v:\n%s", code, want, stdout)
	}
	if err := e.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rows := listJSON(t, exitOK, "--redis", a); len(rows) != 0 {
		t.Errorf("after Resign: %+v, want none", rows)
	}
}
