package netlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// checkFree checks that info says the lock is free.
func checkFree(t *testing.T, info Info) {
	t.Helper()
	if info.Held || info.Token != 0 || info.TTL != 0 {
		t.Errorf("got Held %v, Token %d, TTL %v; want a free lock: false, 0, 0", info.Held, info.Token, info.TTL)
	}
}

// TestInspectOneNode follows one lock through its life on one node: free,
// held by a NetMutex, waited for, held by a value that is not netlock's, of
// the wrong type; and checks that Inspect writes nothing.
func TestInspectOneNode(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		b := e.backend(t)
		nodes := []Backend{b}
		k := newKeys(DefaultPrefix, "job", true)

		info := mustInspect(t, "job", nodes)
		checkFree(t, info)
		if n := info.Nodes[0]; n.Held || n.Token != 0 || n.TTL != 0 || n.Waiters != 0 || n.FenceCounter != 0 || n.Err != nil {
			t.Errorf("never used: node %+v, want all zero", n)
		}
		if e.exists(t, k.waiters) || e.exists(t, k.fence) {
			t.Errorf("Inspect created a key")
		}

		m := e.newMutex(t, "job", WithExpiry(time.Minute))
		mustLock(t, m)
		info = mustInspect(t, "job", nodes)
		n := info.Nodes[0]
		if !info.Held || info.Token != m.Token() || info.TTL <= 0 || info.TTL > time.Minute {
			t.Errorf("held: got Held %v, Token %d, TTL %v; want true, %d, (0, 1m]", info.Held, info.Token, info.TTL, m.Token())
		}
		if !n.Held || n.Foreign || n.Token != m.Token() || n.TTL != info.TTL || n.FenceCounter != m.Token() || n.Err != nil {
			t.Errorf("held: node %+v, want held with token %d, TTL %v, fence counter %d", n, m.Token(), info.TTL, m.Token())
		}
		token := m.Token()
		mustUnlock(t, m)
		info = mustInspect(t, "job", nodes)
		checkFree(t, info)
		if got := info.Nodes[0].FenceCounter; got != token {
			t.Errorf("after unlock: fence counter %d, want %d", got, token)
		}

		// From here on, keys are set by hand: nothing else writes while
		// Inspect is checked for writing nothing.
		e.do(t, "SET", k.lock, "s3cret:7", "PX", "60000")
		e.do(t, "ZADD", k.waiters, "1", "w1", "2", "w2")
		before := e.writes(t)
		info = mustInspect(t, "job", nodes)
		if after := e.writes(t); after != before {
			t.Errorf("Inspect wrote to Redis: before\n%s\nafter\n%s", before, after)
		}
		if n := info.Nodes[0]; !info.Held || info.Token != 7 || n.Waiters != 2 || len(n.Holder) != 12 || info.Holder != n.Holder {
			t.Errorf("hand-made hold: got Held %v, Token %d, node %+v; want held with token 7 and 2 waiters", info.Held, info.Token, n)
		}

		e.do(t, "SET", k.lock, "not netlock's")
		info = mustInspect(t, "job", nodes)
		if n := info.Nodes[0]; !info.Held || info.Token != 0 || info.TTL >= 0 || !n.Foreign || n.TTL >= 0 {
			t.Errorf("foreign value without TTL: got Held %v, Token %d, TTL %v, node %+v; want held, token 0, negative TTLs, Foreign", info.Held, info.Token, info.TTL, n)
		}

		for _, wrong := range []struct{ key, cmd string }{{k.lock, "RPUSH"}, {k.waiters, "RPUSH"}, {k.fence, "RPUSH"}} {
			e.do(t, "DEL", k.lock, k.waiters, k.fence)
			e.do(t, wrong.cmd, wrong.key, "x")
			info, err := Inspect(t.Context(), "job", nodes)
			if !errors.Is(err, ErrQuorum) || !strings.Contains(fmt.Sprint(err), "WRONGTYPE") || !strings.HasPrefix(fmt.Sprint(err), "netlock: node 0: ") {
				t.Errorf("%s a list: got error %v, want a node 0 error matching ErrQuorum that says WRONGTYPE", wrong.key, err)
			}
			if len(info.Nodes) != 1 || info.Nodes[0].Err == nil || info.Held {
				t.Errorf("%s a list: got %+v, want one node with its error, not held", wrong.key, info)
			}
			if got, _ := redis.Strings(e.do(t, "LRANGE", wrong.key, "0", "-1"), nil); !slices.Equal(got, []string{"x"}) {
				t.Errorf("%s a list: holds %q after Inspect, want [x]", wrong.key, got)
			}
		}
	})
}

// TestInspectOptions: Inspect finds the keys the options name, as a NetMutex
// made with them does, and validates everything as New does.
func TestInspectOptions(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		nodes := []Backend{e.backend(t)}

		t.Run("WithFencing(false)", func(t *testing.T) {
			m := e.newMutex(t, "nofence", WithFencing(false))
			mustLock(t, m)
			defer mustUnlock(t, m)
			for _, opts := range [][]Option{{WithFencing(false)}, nil} {
				info := mustInspect(t, "nofence", nodes, opts...)
				if n := info.Nodes[0]; !info.Held || info.Token != 0 || n.Foreign || n.FenceCounter != 0 {
					t.Errorf("options %d: got Held %v, Token %d, node %+v; want held with token 0, no fence counter", len(opts), info.Held, info.Token, n)
				}
			}
		})

		t.Run("WithPrefix", func(t *testing.T) {
			m := e.newMutex(t, "job", WithPrefix("app:"))
			mustLock(t, m)
			defer mustUnlock(t, m)
			if info := mustInspect(t, "job", nodes, WithPrefix("app:")); !info.Held || info.Token != m.Token() {
				t.Errorf("prefix app: got Held %v, Token %d, want true, %d", info.Held, info.Token, m.Token())
			}
			checkFree(t, mustInspect(t, "job", nodes))
		})

		t.Run("bad input", func(t *testing.T) {
			for _, tc := range []struct {
				name  string
				nodes []Backend
				opts  []Option
			}{
				{"", nodes, nil},
				{"}job", nodes, nil},
				{"job", nil, nil},
				{"job", []Backend{nodes[0], nil}, nil},
				{"job", []Backend{nodes[0], nodes[0]}, nil},
				{"job", nodes, []Option{WithPrefix("a{")}},
				{"job", nodes, []Option{WithExpiry(time.Millisecond)}},
				{"job", nodes, []Option{nil}},
			} {
				_, want := New(tc.name, tc.nodes, tc.opts...)
				info, err := Inspect(t.Context(), tc.name, tc.nodes, tc.opts...)
				if want == nil || err == nil || err.Error() != want.Error() || info.Nodes != nil {
					t.Errorf("Inspect(%q, %d nodes, %d options): got %v and %d nodes, want New's error %v and none", tc.name, len(tc.nodes), len(tc.opts), err, len(info.Nodes), want)
				}
			}
		})

		t.Run("ctx ended", func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			info, err := Inspect(ctx, "job", nodes)
			if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrQuorum) || info.Held {
				t.Errorf("got Held %v, error %v; want not held and an error matching context.Canceled and ErrQuorum", info.Held, err)
			}
		})
	})
}

// TestInspectQuorum: over three nodes the lock is held when two hold its key
// with one value, whatever the third holds or whether it answers; free when
// no value can have a quorum; and unknown when the node that did not answer
// could make the difference.
func TestInspectQuorum(t *testing.T) {
	for _, real := range []bool{false, true} {
		for _, client := range []string{"redigo", "rueidis"} {
			name := "miniredis/" + client
			if real {
				name = "redis/" + client
			}
			t.Run(name, func(t *testing.T) { testInspectQuorum(t, real, client) })
		}
	}
}

func testInspectQuorum(t *testing.T, real bool, client string) {
	envs := make([]*env, 3)
	nodes := make([]Backend, 3)
	for i := range envs {
		if real {
			s := redistest.Start(t)
			envs[i] = &env{server: s, client: client, addr: s.Addr()}
		} else {
			mini := miniredis.RunT(t)
			envs[i] = &env{mini: mini, client: client, addr: mini.Addr()}
		}
		nodes[i] = envs[i].backend(t)
	}
	stop := func(i int) {
		if real {
			envs[i].server.Stop()
		} else {
			envs[i].mini.Close()
		}
	}

	m, err := New("job", nodes)
	if err != nil {
		t.Fatal(err)
	}
	mustLock(t, m)
	if info := mustInspect(t, "job", nodes); !info.Held || info.Token != m.Token() || info.TTL <= 0 || info.TTL > DefaultExpiry {
		t.Errorf("held by a NetMutex: got Held %v, Token %d, TTL %v; want true, %d, (0, %v]", info.Held, info.Token, info.TTL, m.Token(), DefaultExpiry)
	}
	mustUnlock(t, m)

	lock := newKeys(DefaultPrefix, "job", true).lock
	set := func(i int, value string, ttl time.Duration) {
		envs[i].do(t, "SET", lock, value, "PX", ttl.Milliseconds())
	}
	// ttl is the hold's TTL: exact on miniredis, where time stands still;
	// at most a second less on a real server.
	for _, step := range []struct {
		name  string
		do    func()
		held  bool
		token uint64
		ttl   time.Duration
		err   bool // unknown: an error matching ErrQuorum
	}{
		{"free", func() {}, false, 0, 0, false},
		{"one node", func() { set(0, "a:4", 60*time.Second) }, false, 0, 0, false},
		{"two values", func() { set(1, "b:5", 60*time.Second) }, false, 0, 0, false},
		{"two values, one token", func() { set(0, "a:0", 60*time.Second); set(1, "b:0", 60*time.Second) }, false, 0, 0, false},
		{"two nodes", func() { set(0, "a:4", 60*time.Second); set(1, "a:4", 30*time.Second) }, true, 4, 30 * time.Second, false},
		{"three nodes", func() { set(2, "a:4", 45*time.Second) }, true, 4, 45 * time.Second, false},
		{"two nodes, one down", func() { stop(2) }, true, 4, 30 * time.Second, false},
		{"one node, one down", func() { envs[1].do(t, "DEL", lock) }, false, 0, 0, true},
		{"none, one down", func() { envs[0].do(t, "DEL", lock) }, false, 0, 0, false},
	} {
		step.do()
		t.Run(step.name, func(t *testing.T) {
			info, err := Inspect(t.Context(), "job", nodes)
			if len(info.Nodes) != 3 {
				t.Fatalf("got %d nodes, want 3 (error %v)", len(info.Nodes), err)
			}
			if step.err != errors.Is(err, ErrQuorum) || (!step.err && err != nil) {
				t.Errorf("got error %v, want one matching ErrQuorum: %v", err, step.err)
			}
			if step.err && !strings.HasPrefix(err.Error(), "netlock: cannot tell whether the lock is held: 2 of 3 nodes answered, 1 of them hold the key with one value, a quorum is 2; netlock: node 2: ") {
				t.Errorf("error %q does not say why it cannot tell", err)
			}
			if info.Held != step.held || info.Token != step.token {
				t.Errorf("got Held %v, Token %d; want %v, %d", info.Held, info.Token, step.held, step.token)
			}
			if info.TTL > step.ttl || info.TTL < step.ttl-time.Second || (!real && info.TTL != step.ttl) {
				t.Errorf("got TTL %v, want %v", info.TTL, step.ttl)
			}
			down := strings.Contains(step.name, "down")
			if got := info.Nodes[2].Err != nil; got != down {
				t.Errorf("node 2's error %v, want one: %v", info.Nodes[2].Err, down)
			}
		})
	}
}

// TestInspectMaxmemoryPolicy: Inspect reports the server's maxmemory-policy,
// and which ones evict lock keys.
func TestInspectMaxmemoryPolicy(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		nodes := []Backend{e.backend(t)}
		if e.mini != nil {
			// miniredis's INFO has no memory section.
			if n := mustInspect(t, "job", nodes).Nodes[0]; n.MaxMemoryPolicy != "" || n.MaxMemory != -1 || n.Evicts() {
				t.Errorf("miniredis: got policy %q, maxmemory %d, evicts %v; want unknown: \"\", -1, false", n.MaxMemoryPolicy, n.MaxMemory, n.Evicts())
			}
			return
		}
		for _, tc := range []struct {
			policy    string
			maxmemory string
			bytes     int64
			evicts    bool
		}{
			{"noeviction", "0", 0, false},
			{"allkeys-lru", "0", 0, true},
			{"allkeys-lru", "100mb", 100 << 20, true},
			{"volatile-ttl", "100mb", 100 << 20, true},
			{"allkeys-random", "0", 0, true},
			{"volatile-lfu", "0", 0, true},
			{"noeviction", "100mb", 100 << 20, false},
		} {
			e.do(t, "CONFIG", "SET", "maxmemory-policy", tc.policy, "maxmemory", tc.maxmemory)
			n := mustInspect(t, "job", nodes).Nodes[0]
			if n.MaxMemoryPolicy != tc.policy || n.MaxMemory != tc.bytes || n.Evicts() != tc.evicts {
				t.Errorf("%s, maxmemory %s: got policy %q, maxmemory %d, evicts %v; want %q, %d, %v",
					tc.policy, tc.maxmemory, n.MaxMemoryPolicy, n.MaxMemory, n.Evicts(), tc.policy, tc.bytes, tc.evicts)
			}
		}
	})
}

// TestInspectNoInfo: a user who may not run INFO still sees the lock; the
// policy is unknown.
func TestInspectNoInfo(t *testing.T) {
	s := redistest.Start(t, "--user", "bob", "on", ">pw", "~*", "&*", "+@all", "-info")
	pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", s.Addr(), redis.DialUsername("bob"), redis.DialPassword("pw"))
	}}
	defer pool.Close()
	c := pool.Get()
	if _, err := c.Do("INFO", "memory"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("INFO as bob: got %v, want NOPERM", err)
	}
	c.Close()
	if _, err := s.Do("SET", newKeys(DefaultPrefix, "job", true).lock, "v:3", "PX", "60000"); err != nil {
		t.Fatal(err)
	}
	info := mustInspect(t, "job", []Backend{NewRedigo(pool)})
	if n := info.Nodes[0]; !info.Held || info.Token != 3 || n.MaxMemoryPolicy != "" || n.MaxMemory != -1 {
		t.Errorf("got Held %v, Token %d, policy %q, maxmemory %d; want held with token 3, policy unknown (\"\", -1)", info.Held, info.Token, n.MaxMemoryPolicy, n.MaxMemory)
	}
}

// TestInspectJudge checks the quorum rules on hand-made answers.
func TestInspectJudge(t *testing.T) {
	down := NodeInfo{Err: errors.New("netlock: node 9: down")}
	free := NodeInfo{}
	hold := func(holder int64, token uint64, ttl time.Duration) NodeInfo {
		return NodeInfo{Held: true, Token: token, TTL: ttl, Holder: fmt.Sprint(holder)}
	}
	for _, tc := range []struct {
		name  string
		nodes []NodeInfo
		held  bool
		token uint64
		ttl   time.Duration
		err   bool
	}{
		{"one free", []NodeInfo{free}, false, 0, 0, false},
		{"one held", []NodeInfo{hold(1, 7, time.Second)}, true, 7, time.Second, false},
		{"one held, no TTL", []NodeInfo{hold(1, 7, -1)}, true, 7, -1, false},
		{"one down", []NodeInfo{down}, false, 0, 0, true},
		{"3: two of one holder", []NodeInfo{hold(1, 7, 3*time.Second), free, hold(1, 7, 5*time.Second)}, true, 7, 3 * time.Second, false},
		{"3: three, TTL of the second longest", []NodeInfo{hold(1, 7, 3*time.Second), hold(1, 7, 9*time.Second), hold(1, 7, 5*time.Second)}, true, 7, 5 * time.Second, false},
		{"3: two without TTL", []NodeInfo{hold(1, 7, -1), hold(1, 7, 9*time.Second), hold(1, 7, -1)}, true, 7, -1, false},
		{"3: one without TTL", []NodeInfo{hold(1, 7, -1), hold(1, 7, 9*time.Second), free}, true, 7, 9 * time.Second, false},
		{"3: held, one down", []NodeInfo{hold(1, 7, time.Second), down, hold(1, 7, time.Second)}, true, 7, time.Second, false},
		{"3: two holders, same token", []NodeInfo{hold(1, 0, time.Second), hold(2, 0, time.Second), free}, false, 0, 0, false},
		{"3: two holders, one down", []NodeInfo{hold(1, 7, time.Second), hold(2, 8, time.Second), down}, false, 0, 0, true},
		{"3: one holder, one down", []NodeInfo{hold(1, 7, time.Second), free, down}, false, 0, 0, true},
		{"3: none, one down", []NodeInfo{free, free, down}, false, 0, 0, false},
		{"3: none, two down", []NodeInfo{free, down, down}, false, 0, 0, true},
		{"3: held, two down", []NodeInfo{hold(1, 7, time.Second), down, down}, false, 0, 0, true},
		{"4: two of four", []NodeInfo{hold(1, 7, time.Second), hold(1, 7, time.Second), free, free}, false, 0, 0, false},
		{"4: three of four", []NodeInfo{hold(1, 7, time.Second), hold(1, 7, 2*time.Second), free, hold(1, 7, 3*time.Second)}, true, 7, time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := judge(tc.nodes, len(tc.nodes)/2+1)
			if (err != nil) != tc.err {
				t.Errorf("got error %v, want one: %v", err, tc.err)
			}
			if err != nil && !errors.Is(err, ErrQuorum) {
				t.Errorf("error %v does not match ErrQuorum", err)
			}
			if info.Held != tc.held || info.Token != tc.token || info.TTL != tc.ttl {
				t.Errorf("got Held %v, Token %d, TTL %v; want %v, %d, %v", info.Held, info.Token, info.TTL, tc.held, tc.token, tc.ttl)
			}
		})
	}
}
