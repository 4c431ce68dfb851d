package netlock

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/redis/rueidis"
	"pgregory.net/rapid"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// Helpers shared by the tests of several files, by what they help with.
// The tests' Backends and Listeners are in fakes_test.go; the client
// libraries the tests run on, in export_test.go.

// Where tests run: a server and a client library.

// env is one place tests run: a server (miniredis or a real redis-server)
// and a client library (one of testClients).
type env struct {
	mini   *miniredis.Miniredis // nil on a real server
	server *redistest.Server    // nil on miniredis
	client string               // one of testClients: "redigo", "rueidis", or a registered one
	addr   string
}

// envKinds selects where forEachEnv runs a test.
type envKinds int

const (
	allEnvs  envKinds = iota // miniredis and real redis-server
	miniOnly                 // tests that move time with FastForward
	realOnly                 // tests that stop or kill the server process
)

// forEachEnv runs fn as a subtest on miniredis and, unless kinds is
// miniOnly, on a real redis-server (realOnly: only there), each with every
// client library of testClients. The real server subtests are skipped when
// redis-server is missing, and fail instead when NETLOCK_REQUIRE_REDIS=1.
func forEachEnv(t *testing.T, kinds envKinds, fn func(t *testing.T, e *env)) {
	t.Helper()
	for _, client := range testClients() {
		if kinds == realOnly {
			break
		}
		t.Run("miniredis/"+client, func(t *testing.T) {
			mini := miniredis.RunT(t)
			fn(t, &env{mini: mini, client: client, addr: mini.Addr()})
		})
	}
	if kinds == miniOnly {
		return
	}
	for _, client := range testClients() {
		t.Run("redis/"+client, func(t *testing.T) {
			s := redistest.Start(t)
			fn(t, &env{server: s, client: client, addr: s.Addr()})
		})
	}
}

// backend returns a Backend on a client of its own, as another process
// would have; the client is closed when the test ends.
func (e *env) backend(t testing.TB) Backend {
	t.Helper()
	return newBackend(t, e.client, e.addr)
}

func newBackend(t testing.TB, client, addr string) Backend {
	t.Helper()
	switch client {
	case "redigo":
		pool := &redis.Pool{
			MaxIdle: 16,
			DialContext: func(ctx context.Context) (redis.Conn, error) {
				return redis.DialContext(ctx, "tcp", addr)
			},
		}
		t.Cleanup(func() { pool.Close() })
		return NewRedigo(pool)
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:  []string{addr},
			DisableCache: true, // netlock never reads through the cache; miniredis has no CLIENT TRACKING
			// miniredis answers CLUSTER SLOTS, so rueidis would take it for
			// a Redis Cluster, whose Backend waits by sharded pub/sub,
			// which miniredis lacks. Every server here is a single one.
			ForceSingleClient: true,
		})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%s): %v", addr, err)
		}
		t.Cleanup(c.Close)
		return NewRueidis(c)
	}
	return openRegistered(t, client, TestClientConfig{Addr: addr})
}

// openRegistered returns a Backend of the registered client library client
// for c, closed when the test ends.
func openRegistered(t testing.TB, client string, c TestClientConfig) Backend {
	t.Helper()
	open := registeredClient(client)
	if open == nil {
		t.Fatalf("unknown client %q", client)
	}
	b, closeClient, err := open(c)
	if err != nil {
		t.Fatalf("%s client on %s: %v", client, c.Addr, err)
	}
	t.Cleanup(closeClient)
	return b
}

// newMutex returns a NetMutex on a backend of its own.
func (e *env) newMutex(t testing.TB, name string, opts ...Option) *NetMutex {
	t.Helper()
	m, err := New(name, []Backend{e.backend(t)}, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return m
}

// do runs one command on the server, for a test to look at or change keys
// behind netlock's back.
func (e *env) do(t testing.TB, args ...any) any {
	t.Helper()
	c, err := redis.Dial("tcp", e.addr, redis.DialReadTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("dial %s: %v", e.addr, err)
	}
	defer c.Close()
	cmd, _ := args[0].(string)
	reply, err := c.Do(cmd, args[1:]...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return reply
}

// exists reports whether key exists on the server.
func (e *env) exists(t testing.TB, key string) bool {
	t.Helper()
	n, _ := redis.Int(e.do(t, "EXISTS", key), nil)
	return n == 1
}

// Locks and waits.

// mustLock locks m with a bound, failing the test rather than hanging.
func mustLock(t testing.TB, m *NetMutex) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.LockCtx(ctx); err != nil {
		t.Fatalf("LockCtx: %v", err)
	}
}

// mustUnlock unlocks m and fails the test on error.
func mustUnlock(t testing.TB, m *NetMutex) {
	t.Helper()
	if err := m.UnlockCtx(context.Background()); err != nil {
		t.Fatalf("UnlockCtx: %v", err)
	}
}

// async calls f in a goroutine, with a context bounded to 10s, and returns
// where its error arrives.
func async(f func(ctx context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- f(ctx)
	}()
	return done
}

// eventually fails the test unless cond holds within d, saying what was
// awaited. It is the tests' one way to wait for something to happen (a
// waiter queued, a message delivered, a key gone): cond is checked at once,
// then after 1ms, 2ms, 4ms… and every 20ms from then on, so a cond that asks
// a server does not flood it, and once more after d. t is a *testing.T, a
// *testing.B or a *rapid.T.
func eventually(t rapid.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(pause) // between checks of cond, not an ordering
	}
}

// newRW returns a NetRWMutex on a Backend of its own, as another process
// would have.
func (e *env) newRW(t testing.TB, name string, opts ...Option) *NetRWMutex {
	t.Helper()
	rw, err := NewRW(name, []Backend{e.backend(t)}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return rw
}

// newSem returns a Semaphore on a backend of its own, as another process
// would have.
func (e *env) newSem(t testing.TB, name string, size int64, opts ...Option) *Semaphore {
	t.Helper()
	s, err := NewSemaphore(name, size, []Backend{e.backend(t)}, opts...)
	if err != nil {
		t.Fatalf("NewSemaphore(%q, %d): %v", name, size, err)
	}
	return s
}

// newElection returns an Election on a backend of its own, as another
// process would have.
func (e *env) newElection(t testing.TB, name string, opts ...Option) *Election {
	t.Helper()
	el, err := NewElection(name, []Backend{e.backend(t)}, opts...)
	if err != nil {
		t.Fatalf("NewElection(%q): %v", name, err)
	}
	return el
}

// newMulti returns a MultiMutex of names on a backend of its own.
func (e *env) newMulti(t testing.TB, names []string, opts ...Option) *MultiMutex {
	t.Helper()
	mm, err := NewMulti(names, []Backend{e.backend(t)}, opts...)
	if err != nil {
		t.Fatalf("NewMulti(%q): %v", names, err)
	}
	return mm
}

// queued returns the members of name's waiters' queue.
func (e *env) queued(t testing.TB, name string) []string {
	t.Helper()
	members, err := redis.Strings(e.do(t, "ZRANGE", "netlock:{"+name+"}:waiters", 0, -1), nil)
	if err != nil {
		t.Fatalf("ZRANGE: %v", err)
	}
	return members
}

// mustLockMulti locks mm with a bound, failing the test rather than hanging.
func mustLockMulti(t testing.TB, mm *MultiMutex) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mm.LockCtx(ctx); err != nil {
		t.Fatalf("LockCtx(%q): %v", mm.Names(), err)
	}
}

func mustAcquire(t testing.TB, s *Semaphore, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Acquire(ctx, n); err != nil {
		t.Fatalf("Acquire(%d): %v", n, err)
	}
}

// campaign starts Campaign on a goroutine; its error comes on the channel.
func campaign(ctx context.Context, el *Election, value string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- el.Campaign(ctx, value) }()
	return done
}

// mustCampaign campaigns with a bound, failing the test rather than hanging.
func mustCampaign(t testing.TB, el *Election, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := el.Campaign(ctx, value); err != nil {
		t.Fatalf("Campaign(%q): %v", value, err)
	}
}

// mustLeader returns who leads, failing the test on an error.
func mustLeader(t testing.TB, el *Election) Leader {
	t.Helper()
	l, err := el.Leader(context.Background())
	if err != nil {
		t.Fatalf("Leader: %v", err)
	}
	return l
}

// recv returns the next Leader Observe delivers, failing the test if none
// comes within d or the channel is closed.
func recv(t testing.TB, ch <-chan Leader, d time.Duration, what string) Leader {
	t.Helper()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatalf("%s: Observe's channel closed", what)
		}
		return l
	case <-time.After(d):
		t.Fatalf("%s: nothing delivered within %v", what, d)
	}
	return Leader{}
}

// waitingMutex returns a NetMutex for name on a counting backend of its own,
// with a retry delay so long that only a wake-up explains a prompt attempt.
func waitingMutex(t *testing.T, e *env, name string) (*NetMutex, *countingBackend) {
	t.Helper()
	cb := counting(e.backend(t))
	m, err := New(name, []Backend{cb}, WithRetryDelay(time.Millisecond, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return m, cb
}

// lockInBackground starts m.LockCtx and waits until it has made its second
// attempt (the one after subscribing): it is then waiting. Its result comes
// on the returned channel.
func lockInBackground(t *testing.T, m *NetMutex, cb *countingBackend) <-chan error {
	t.Helper()
	locked := make(chan error, 1)
	go func() { locked <- m.LockCtx(context.Background()) }()
	eventually(t, 5*time.Second, "the waiter's second attempt", func() bool { return cb.count("acquire") >= 2 })
	return locked
}

func lockWithin(t *testing.T, m *NetMutex) (err error) {
	t.Helper()
	redistest.Within(t, 5*time.Second, "LockCtx", func() { err = m.LockCtx(context.Background()) })
	return err
}

// isOpen reports whether c is not closed.
func isOpen(c <-chan struct{}) bool {
	select {
	case <-c:
		return false
	default:
		return true
	}
}

// recoverErr runs fn and returns the error it panicked with (nil if it did
// not panic).
func recoverErr(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			var ok bool
			if err, ok = r.(error); !ok {
				err = errors.New("panic with a non-error value")
			}
		}
	}()
	fn()
	return nil
}

// windowCtx is a waiter's ctx that holds the waiter where it has queued and
// is about to wait for its turn (in missingPeersRound and TestProperty's
// "cancel while a hand-off is in flight"): the first call of Done, made by
// the select that waits, reports the waiter on arrived and blocks until goOn
// is closed. Everything else is the embedded Context's.
type windowCtx struct {
	context.Context
	once    sync.Once
	arrived chan<- struct{}
	goOn    <-chan struct{}
}

func (c *windowCtx) Done() <-chan struct{} {
	c.once.Do(func() {
		c.arrived <- struct{}{}
		<-c.goOn
	})
	return c.Context.Done()
}

// section is a critical section that notices overlap: inside counts the
// goroutines in it at once, and count is updated without synchronisation of
// its own, as code guarded by a mutex would be.
type section struct {
	inside   atomic.Int32
	overlaps atomic.Int32
	count    int
}

func (s *section) run(pause time.Duration) {
	if s.inside.Add(1) != 1 {
		s.overlaps.Add(1)
	}
	c := s.count
	time.Sleep(pause) // the section's length: a lost update shows if another enters
	s.count = c + 1
	s.inside.Add(-1)
}

func (s *section) check(t *testing.T, want int) {
	t.Helper()
	if n := s.overlaps.Load(); n != 0 {
		t.Errorf("overlapping critical sections: got %d, want 0", n)
	}
	if s.count != want {
		t.Errorf("count: got %d, want %d", s.count, want)
	}
}

// rwChecker counts the readers and writers inside their sections, across
// every process of a test, and records any overlap a NetRWMutex must
// exclude.
type rwChecker struct {
	readers, writers atomic.Int64
	violations       atomic.Int64
	reads, writes    atomic.Int64
}

func (c *rwChecker) read(pause time.Duration) {
	c.readers.Add(1)
	if c.writers.Load() != 0 {
		c.violations.Add(1)
	}
	time.Sleep(pause) // the section's length
	if c.writers.Load() != 0 {
		c.violations.Add(1)
	}
	c.readers.Add(-1)
	c.reads.Add(1)
}

func (c *rwChecker) write(pause time.Duration) {
	if c.writers.Add(1) != 1 || c.readers.Load() != 0 {
		c.violations.Add(1)
	}
	time.Sleep(pause) // the section's length
	if c.writers.Load() != 1 || c.readers.Load() != 0 {
		c.violations.Add(1)
	}
	c.writers.Add(-1)
	c.writes.Add(1)
}

// checkNotHeld checks that mm, not locked, answers as a NetMutex does:
// ErrNotHeld, a panic on Unlock, a closed Lost, no Tokens.
func checkNotHeld(t *testing.T, mm *MultiMutex) {
	t.Helper()
	ctx := context.Background()
	if err := mm.UnlockCtx(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("UnlockCtx not locked: got %v, want ErrNotHeld", err)
	}
	if err := mm.ExtendCtx(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("ExtendCtx not locked: got %v, want ErrNotHeld", err)
	}
	select {
	case <-mm.Lost():
	default:
		t.Error("Lost not locked: not closed")
	}
	if toks := mm.Tokens(); toks != nil {
		t.Errorf("Tokens not locked: got %v, want nil", toks)
	}
	func() {
		defer func() {
			if err, _ := recover().(error); !errors.Is(err, ErrNotHeld) {
				t.Errorf("Unlock not locked: panic %v, want one matching ErrNotHeld", err)
			}
		}()
		mm.Unlock()
	}()
}

// lockWithin calls LockCtx, failing the test if it does not return within 5s.
// hostileOutage is the outage window of the rows whose server never
// answers: LockCtx rides it out, then reports the nodes' errors.
const hostileOutage = 300 * time.Millisecond

// wantNodeErr fails the test unless err is a node error, as an error must
// be when a node cannot be asked: it matches ErrQuorum, names node 0, starts
// "netlock: ", and contains want.
func wantNodeErr(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || !errors.Is(err, ErrQuorum) || !strings.HasPrefix(err.Error(), "netlock: ") ||
		!strings.Contains(err.Error(), "node 0") || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: got %v, want an error matching ErrQuorum, naming node 0 and containing %q", what, err, want)
	}
}

// wantErrs checks that err matches every error of want and none of
// unwanted, and that its message is one line.
func wantErrs(t *testing.T, what string, err error, want, unwanted []error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: got nil, want an error matching %v", what, want)
	}
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Errorf("%s: got %q, want it to match %v", what, err, w)
		}
	}
	for _, u := range unwanted {
		if errors.Is(err, u) {
			t.Errorf("%s: got %q, which matches %v: want it not to", what, err, u)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("%s: got %q, want one line", what, err)
	}
}

// logRecords is a slog.Handler that keeps every record, with its
// attributes flattened to strings.
type logRecords struct {
	level slog.Level
	mu    sync.Mutex
	recs  []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (l *logRecords) Enabled(_ context.Context, level slog.Level) bool { return level >= l.level }

func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	return nil
}

func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }

func (l *logRecords) WithGroup(string) slog.Handler { return l }

func (l *logRecords) count(level slog.Level) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.level == level {
			n++
		}
	}
	return n
}

// find returns the records at level whose message contains msg.
func (l *logRecords) find(level slog.Level, msg string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.recs {
		if r.level == level && strings.Contains(r.msg, msg) {
			out = append(out, r)
		}
	}
	return out
}

func mustGet(t *testing.T, errc <-chan error) {
	t.Helper()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// sorted returns a sorted copy of s.
func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// Servers: starting them, and what they say.

// startServers starts n independent redis-servers.
func startServers(t *testing.T, n int, args ...string) []*redistest.Server {
	t.Helper()
	servers := make([]*redistest.Server, n)
	for i := range servers {
		servers[i] = redistest.Start(t, args...)
	}
	return servers
}

// quorumMutex returns a NetMutex over servers, with clients of its own (as
// another process would have).
func quorumMutex(t *testing.T, client string, servers []*redistest.Server, name string, opts ...Option) *NetMutex {
	t.Helper()
	backends := make([]Backend, len(servers))
	for i, s := range servers {
		backends[i] = newBackend(t, client, s.Addr())
	}
	m, err := New(name, backends, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// holders counts the servers whose lock key for name exists.
func holders(t *testing.T, servers []*redistest.Server, name string) (n int) {
	t.Helper()
	for _, s := range servers {
		if got, err := s.Do("EXISTS", "netlock:{"+name+"}"); err == nil && got == "1" {
			n++
		}
	}
	return n
}

// scriptCalls returns how many EVALSHA and EVAL commands the server has run.
func scriptCalls(t *testing.T, s *redistest.Server) int {
	t.Helper()
	info, err := s.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls=")
		if !ok {
			rest, ok = strings.CutPrefix(line, "cmdstat_eval:calls=")
		}
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.Atoi(calls)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		n += c
	}
	return n
}

// commandCounts returns, summed over servers, total_commands_processed
// (INFO stats), which counts the commands scripts run too, and the commands
// among them that the client library sends of its own accord: rueidis PINGs
// every idle connection each second (its Dialer.KeepAlive) and a cluster
// client asks for the topology (CLUSTER, READONLY...). The INFO that reads
// them counts itself: callers subtract one per call and server.
func commandCounts(t testing.TB, servers []*redistest.Server) (total, library int64) {
	t.Helper()
	for _, s := range servers {
		info, err := s.Do("INFO", "all")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			line = strings.TrimSpace(line)
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				total += n
			}
			for _, cmd := range []string{"ping", "cluster|", "readonly", "hello", "client|"} {
				if v, ok := strings.CutPrefix(line, "cmdstat_"+cmd); ok {
					_, v, _ = strings.Cut(v, "calls=")
					v, _, _ = strings.Cut(v, ",")
					n, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						t.Fatalf("%s: %v", line, err)
					}
					library += n
				}
			}
		}
	}
	return total, library
}

// numsub returns the number of subscribers of channel.
func numsub(t testing.TB, e *env, channel string) int {
	t.Helper()
	v, err := redis.Values(e.do(t, "PUBSUB", "NUMSUB", channel), nil)
	if err != nil || len(v) != 2 {
		t.Fatalf("PUBSUB NUMSUB: %v %v", v, err)
	}
	n, _ := redis.Int(v[1], nil)
	return n
}

// connectedClients returns the server's connected_clients, or -1.
func connectedClients(s *redistest.Server) int64 {
	info, err := s.Do("INFO", "clients")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// sdo runs a command on s and fails the test on error.
func sdo(t *testing.T, s *redistest.Server, args ...string) string {
	t.Helper()
	v, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return v
}

// startReplicated starts a primary and a replica of it, linked.
func startReplicated(t *testing.T) (primary, replica *redistest.Server) {
	t.Helper()
	primary = redistest.Start(t)
	return primary, redistest.StartReplica(t, primary.Addr())
}

// caughtUp waits until n replicas of the primary at addr have caught up
// with it: they acknowledged a write made after everything before it.
func caughtUp(t *testing.T, addr string, n int) {
	t.Helper()
	c, err := redis.Dial("tcp", addr, redis.DialReadTimeout(15*time.Second))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	if _, err := c.Do("INCR", "netlock-test:caught-up"); err != nil {
		t.Fatalf("INCR: %v", err)
	}
	if acked, err := redis.Int(c.Do("WAIT", n, 10_000)); acked < n {
		t.Fatalf("WAIT %d: %d replicas acknowledged within 10s (%v)", n, acked, err)
	}
}

// heldValue returns what m's lock key holds while m is held:
// "<value>:<token>:<holder>" (see lua/acquire.lua).
func heldValue(m *NetMutex) string {
	h := m.current()
	return keyValue(h.value, h.token)
}

// infoField returns the value of field in an INFO or CLUSTER INFO reply.
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// Redis Cluster.

// clusterKinds are the client libraries with a cluster client: redigo has
// none.
func clusterKinds() []string {
	return slices.DeleteFunc(testClients(), func(c string) bool { return c == "redigo" })
}

// newClusterClient returns a rueidis cluster client of its own, as another
// process would have; it is closed when the test ends.
func newClusterClient(t testing.TB, cluster *redistest.Cluster) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cluster.Addrs(), DisableCache: true})
	if err != nil {
		t.Fatalf("rueidis.NewClient(%q): %v", cluster.Addrs(), err)
	}
	t.Cleanup(c.Close)
	// Replicas too, once rueidis has refreshed its view (CLUSTER SHARDS).
	for _, m := range masters(t, cluster) {
		if _, ok := c.Nodes()[m.Addr()]; !ok {
			t.Fatalf("rueidis client nodes %v, want every master's, %s among them", nodeAddrs(c), m.Addr())
		}
	}
	return c
}

// clusterBackend returns a Backend of client library kind ("rueidis" or a
// registered one) on a cluster client of its own, as another process would
// have; it is closed when the test ends.
func clusterBackend(t testing.TB, kind string, cluster *redistest.Cluster) Backend {
	t.Helper()
	if kind == "rueidis" {
		return NewRueidis(newClusterClient(t, cluster))
	}
	return openRegistered(t, kind, TestClientConfig{Cluster: cluster.Addrs()})
}

// clusterInt runs cmd on the cluster client, which routes it by key slot,
// and returns its integer reply.
func clusterInt(t testing.TB, c rueidis.Client, cmd rueidis.Completed) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), cmd).AsInt64()
	if err != nil {
		t.Fatalf("%q: %v", cmd.Commands(), err)
	}
	return n
}

// masters returns the nodes of cluster that ROLE says are masters.
func masters(t testing.TB, cluster *redistest.Cluster) []*redistest.Server {
	t.Helper()
	var ms []*redistest.Server
	for _, s := range cluster.Servers() {
		if role, err := s.Do("ROLE"); err == nil && strings.HasPrefix(role, "master\n") {
			ms = append(ms, s)
		}
	}
	return ms
}

// ownerOf returns the address of the node that serves key: the other nodes
// answer with a MOVED redirection.
func ownerOf(t testing.TB, cluster *redistest.Cluster, key string) string {
	t.Helper()
	owner := ""
	for _, s := range cluster.Servers() {
		_, err := s.Do("EXISTS", key)
		switch {
		case err == nil && owner == "":
			owner = s.Addr()
		case err == nil:
			t.Fatalf("both %s and %s serve %q", owner, s.Addr(), key)
		case !strings.HasPrefix(err.Error(), "MOVED "):
			t.Fatalf("EXISTS %q on %s: %v", key, s.Addr(), err)
		}
	}
	if owner == "" {
		t.Fatalf("no node serves %q", key)
	}
	return owner
}

// namesOnEveryMaster returns lock names, prefix-0, prefix-1..., until one
// lives on each master of cluster; the result holds one name per master.
func namesOnEveryMaster(t testing.TB, cluster *redistest.Cluster, prefix string) []string {
	t.Helper()
	seen := map[string]bool{}
	var names []string
	for i := 0; len(names) < len(masters(t, cluster)); i++ {
		if i == 1000 {
			t.Fatalf("names %s-0..%d: owners %v, want every master", prefix, i, seen)
		}
		name := fmt.Sprintf("%s-%d", prefix, i)
		if owner := ownerOf(t, cluster, "netlock:{"+name+"}"); !seen[owner] {
			seen[owner] = true
			names = append(names, name)
		}
	}
	return names
}

// newTestMutex returns New(name, []Backend{b}, opts...), failing the test
// on error.
func newTestMutex(t testing.TB, name string, b Backend, opts ...Option) *NetMutex {
	t.Helper()
	m, err := New(name, []Backend{b}, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return m
}

// publishCalls returns the PUBLISH and SPUBLISH calls (INFO commandstats,
// scripts' included) summed over the running nodes of cluster.
func publishCalls(t testing.TB, cluster *redistest.Cluster) (publish, spublish int64) {
	t.Helper()
	for _, s := range cluster.Servers() {
		info, err := s.Do("INFO", "commandstats")
		if err != nil {
			continue // a node killed by the test
		}
		for line := range strings.SplitSeq(info, "\n") {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
			if !ok {
				continue
			}
			name, rest, _ := strings.Cut(rest, ":calls=")
			n, _, _ := strings.Cut(rest, ",")
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				t.Fatalf("commandstats line %q on %s: %v", line, s.Addr(), err)
			}
			switch name {
			case "publish":
				publish += v
			case "spublish":
				spublish += v
			}
		}
	}
	return publish, spublish
}

// waitRueidisDelayedCloses waits (at most 10s) until goroutines that a
// rueidis cluster client starts to close a superseded connection five seconds
// later have ended, so that goleak in TestMain does not report them. NewClient
// usually starts some: it dials every InitAddress concurrently, returns after
// the first dial, and its topology refresh then supersedes the connections
// the other dials add meanwhile (rueidis v1.0.79, cluster.go, _refresh).
// It waits as well for the topology refresh a cluster client delays after
// a node's error or a connection's close, by up to a second, which Close
// leaves running (singleflight.go, DelayDo; cluster.go, lazyRefresh).
func waitRueidisDelayedCloses(t testing.TB) {
	t.Helper()
	start := time.Now()
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		stacks := string(buf[:n])
		if !strings.Contains(stacks, "created by github.com/redis/rueidis.(*clusterClient)._refresh") &&
			!strings.Contains(stacks, "created by github.com/redis/rueidis.(*clusterClient).redirectOrNew") &&
			!strings.Contains(stacks, "created by github.com/redis/rueidis.(*call).DelayDo") {
			if d := time.Since(start); d > 100*time.Millisecond {
				t.Logf("waited %v for rueidis's delayed connection closes", d.Round(time.Millisecond))
			}
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Logf("rueidis's delayed connection closes still pending after 10s; goleak will report them")
			return
		}
		time.Sleep(50 * time.Millisecond) // between looks at the stacks
	}
}

// ownerServer returns the master that serves lock name's keys.
func ownerServer(t testing.TB, cluster *redistest.Cluster, name string) *redistest.Server {
	t.Helper()
	owner := ownerOf(t, cluster, "netlock:{"+name+"}")
	for _, s := range cluster.Servers() {
		if s.Addr() == owner {
			return s
		}
	}
	t.Fatalf("no server at %s", owner)
	return nil
}

// replicaOf returns a replica of master whose replication link is up.
func replicaOf(t testing.TB, cluster *redistest.Cluster, master *redistest.Server) *redistest.Server {
	t.Helper()
	_, port, _ := strings.Cut(master.Addr(), ":")
	var found *redistest.Server
	eventually(t, 10*time.Second, "a replica of "+master.Addr()+" in sync", func() bool {
		for _, s := range cluster.Servers() {
			info, err := s.Do("INFO", "replication")
			if err == nil && infoField(info, "master_port") == port && infoField(info, "master_link_status") == "up" {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

// groupsOf returns mm's names by slot group, in the order the groups are
// taken.
func groupsOf(mm *MultiMutex) [][]string {
	var groups [][]string
	for _, g := range mm.m.(*slotGroups).groups {
		groups = append(groups, g.kind.(*multiKind).names)
	}
	return groups
}

func nodeAddrs(c rueidis.Client) []string {
	var addrs []string
	for a := range c.Nodes() {
		addrs = append(addrs, a)
	}
	return addrs
}

// What a lock leaves in Redis and in its process.

// keyValue is what a lock or writer key holds for the hold of value with
// token, taken with the default holder identity: "<value>:<token>:<holder>"
// (see lua/acquire.lua).
func keyValue(value string, token uint64) string {
	return value + ":" + strconv.FormatUint(token, 10) + ":" + keyspace.HolderEncode(defaultHolderInfo())
}

// unmarked returns a lock key's value v without the '+' that ends it when
// the waiters' queue may exist (see lua/acquire.lua), to compare with
// keyValue.
func unmarked(v string) string { return strings.TrimSuffix(v, "+") }

// selfHolder is the default holder identity: "<hostname>/<pid>" of this
// process, as the test works it out.
func selfHolder(t *testing.T) string {
	t.Helper()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

// An identity with every byte the scripts split values and members on.
const oddHolder = "worker-2: pid 7 +#% ü"

// mustInspect runs Inspect and fails the test on an error.
func mustInspect(t *testing.T, name string, backends []Backend, opts ...Option) Info {
	t.Helper()
	info, err := Inspect(t.Context(), name, backends, opts...)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", name, err)
	}
	if len(info.Nodes) != len(backends) {
		t.Fatalf("Inspect(%q): %d nodes, want %d", name, len(info.Nodes), len(backends))
	}
	return info
}

// writes returns a fingerprint of everything written to e's server: on a
// real server its count of changes since the last save (every write counts,
// persistence or not); on miniredis every key with its value and TTL (which
// moves only with FastForward).
func (e *env) writes(t *testing.T) string {
	t.Helper()
	if e.mini == nil {
		info, err := redis.String(e.do(t, "INFO", "persistence"), nil)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if strings.HasPrefix(line, "rdb_changes_since_last_save:") {
				return line
			}
		}
		t.Fatalf("no rdb_changes_since_last_save in INFO persistence:\n%s", info)
	}
	var b strings.Builder
	b.WriteString(e.mini.Dump())
	for _, k := range e.mini.Keys() {
		fmt.Fprintf(&b, "%s ttl %v\n", k, e.mini.TTL(k))
	}
	return b.String()
}

// granted reports whether a hold's value is one a release made: "<nonce>.<n>"
// (an attempt's own value, rand.Text, has no dot).
func grantedValue(h *hold) bool { return h != nil && strings.Contains(h.value, ".") }

// listening reports whether a client listens on channel.
func listening(srv *miniredis.Miniredis, channel string) bool {
	return srv.PubSubNumSub(channel)[channel] > 0
}

// localWaiters returns how many goroutines wait in m's local queue, and
// how many of them are shared.
func (m *engine) localWaiters() (all, shared int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.waiters {
		if w.shared {
			shared++
		}
	}
	return len(m.waiters), shared
}

// resendingTo reports whether m's reaper has something to send to node i,
// or is sending it.
func (m *engine) resendingTo(i int) bool {
	return m.reaper.any(func(d redelivery) bool {
		switch d := d.(type) {
		case *pendingRelease:
			return d.node == i
		case *pendingLeave:
			return d.node == i
		}
		return false
	})
}

// Semaphores.

// semOut returns the permits out in Redis, by the leases' counts and
// grants.
func semOut(t testing.TB, e *env, name string) int64 {
	t.Helper()
	leases, err := redis.Strings(e.do(t, "ZRANGE", "netlock:{"+name+"}:sem", 0, -1), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out int64
	for _, v := range leases {
		n, _ := redis.Int64(e.do(t, "HGET", "netlock:{"+name+"}:sem:permits", v), nil)
		out += n
		// A grant not yet folded into the count: "<nonce>:<n>".
		if g, err := redis.String(e.do(t, "HGET", "netlock:{"+name+"}:sem:permits", v+"#g"), nil); err == nil {
			_, c, _ := strings.Cut(g, ":")
			n, _ := strconv.ParseInt(c, 10, 64)
			out += n
		}
	}
	return out
}

func semKeysOf(name string) []string {
	k := keyspace.Sem(DefaultPrefix, name)
	return []string{k.Leases, k.Permits, k.Queue, k.Places, k.Wants}
}

// semCallKeys returns the keys of a call of lua/sem_acquire.lua or
// sem_release.lua with argument arg: keys, and the tombstone of the lease
// value arg begins with.
func semCallKeys(keys []string, arg string) []string {
	value, _, _ := strings.Cut(arg, ":")
	return append(keys[:len(keys):len(keys)], keyspace.Tomb(keys[0], value))
}

// line returns s's local line of waiters, in order: the first (the owner
// of s.m, which talks to Redis), then those queued behind it. The caller
// holds s.m.mu.
func (s *Semaphore) line() []*localWaiter {
	m := s.m
	if !m.owned || m.first == nil {
		return slices.Clone(m.waiters)
	}
	return append([]*localWaiter{m.first}, m.waiters...)
}

// semNext returns the arrival of the next waiter of its process that
// waiter id's entry in Redis names (0: none; -1: no entry).
func semNext(srv *miniredis.Miniredis, name, id string) int64 {
	// "<n>:<grant to>:<nonce>:<g>:<next arrival>:<seq>" (lua/sem_acquire.lua)
	f := strings.Split(srv.HGet("netlock:{"+name+"}:sem:wants", id), ":")
	if len(f) < 5 {
		return -1
	}
	next, _ := strconv.ParseInt(f[4], 10, 64)
	return next
}

// semQueued returns how many waiters of semaphore name are queued in Redis.
func semQueued(t *testing.T, srv *miniredis.Miniredis, name string) int {
	t.Helper()
	m, _ := srv.ZMembers("netlock:{" + name + "}:sem:queue")
	return len(m)
}

// semDump describes the semaphore's keys on srv, for a failure's message.
func semDump(srv *miniredis.Miniredis, keys []string) string {
	var b strings.Builder
	for i, k := range keys {
		switch i {
		case 1, 4:
			fmt.Fprintf(&b, "%s=%v ", k, hashOf(srv, k))
		default:
			ms, _ := srv.ZMembers(k)
			fmt.Fprintf(&b, "%s=[", k)
			for _, m := range ms {
				sc, _ := srv.ZScore(k, m)
				fmt.Fprintf(&b, "%s:%d ", m, int64(sc))
			}
			b.WriteString("] ")
		}
	}
	return b.String()
}

func hashOf(srv *miniredis.Miniredis, k string) map[string]string {
	fs, _ := srv.HKeys(k)
	m := map[string]string{}
	for _, f := range fs {
		m[f] = srv.HGet(k, f)
	}
	return m
}

// newFaultSem returns a Semaphore on a semFaultBackend of its own, as
// another process would have.
func newFaultSem(t *testing.T, srv *miniredis.Miniredis, name string, size int64, opts ...Option) (*Semaphore, *semFaultBackend) {
	t.Helper()
	b := &semFaultBackend{wrapper: wrapper{Backend: newBackend(t, "redigo", srv.Addr())},
		entered: make(chan struct{}), lateGo: make(chan struct{}), lateDone: make(chan struct{})}
	s, err := NewSemaphore(name, size, []Backend{b}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

// Property tests.

// propStats counts the outcomes TestProperty met, by kind.
type propStats struct {
	mu sync.Mutex
	m  map[string]int
}

func (s *propStats) add(name string) {
	s.mu.Lock()
	s.m[name]++
	s.mu.Unlock()
}

func (s *propStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(s.m)) {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%d", k, s.m[k])
	}
	return b.String()
}

// rapidReproducing reports whether rapid was given a seed or a fail file:
// then one Check replays it, and repeating it would replay it again.
func rapidReproducing() bool {
	for _, name := range []string{"rapid.seed", "rapid.failfile"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != f.DefValue {
			return true
		}
	}
	return false
}

// documented reports whether err matches one of netlock's sentinel errors or
// a context error, as every error netlock returns must.
func documented(err error) bool {
	for _, s := range []error{ErrNotObtained, ErrNotHeld, ErrLockLost, ErrQuorum, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// modelNode is the model of one miniredis node of TestProperty, and the node
// itself.
//
// A node goes down in one of two ways, both with srv.Close (miniredis keeps
// its data: no write is lost, as with AOF and fsync), chosen so that what the
// reaper does is deterministic:
//   - crashed: nothing listens; every call is refused, a final error, so
//     nothing is queued for the reaper. Pooled connections are dropped (see
//     gen), so none gives a non-final EOF instead.
//   - partitioned: every call fails with a non-final error (EOF on a pooled
//     connection, an i/o timeout for a new one), so every release sent to the
//     node is queued and the reaper retries it until the node is back, then
//     delivers it.
type modelNode struct {
	srv     *miniredis.Miniredis
	addr    string // srv.Addr, which panics while srv is closed
	up      bool
	key     modelKey // the lock key; value "" when absent
	counter uint64   // the fence counter (no TTL: survives everything)

	// queued holds the values of the holds unlocked while the node was
	// partitioned: the reaper delivers their release when it is back.
	queued map[string]bool

	partitioned atomic.Bool // read by the pool's dial
	// gen is bumped when the node crashes and when it comes back. Pooled
	// connections carry the generation they were dialled in, and one from an
	// earlier generation is dropped when borrowed: so a node that is up
	// always answers (no connection broken by the outage), and a crashed one
	// always refuses.
	gen   atomic.Int64
	conns sync.Map // redis.Conn -> generation it was dialled in
}

// errPartitioned is what dialling a partitioned node gives: a timeout, not
// a final error.
var errPartitioned = &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}

// modelKey is what the model says one node's lock key holds.
type modelKey struct {
	value  string        // lock value of the hold that set it; "" when absent
	token  uint64        // its fencing token: the key holds "<value>:<token>"
	client int           // the client that acquired it
	exp    time.Duration // model time at which it expires
}

// newPool returns a redigo pool on node n (see modelNode).
func (n *modelNode) newPool() *redis.Pool {
	return &redis.Pool{
		MaxIdle: 4,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			if n.partitioned.Load() {
				return nil, errPartitioned
			}
			// The generation is read before dialling: a connection that
			// a restart or crash may have cut is never tagged with a later one.
			gen := n.gen.Load()
			c, err := redis.DialContext(ctx, "tcp", n.addr)
			if err == nil {
				n.conns.Store(c, gen)
			}
			return c, err
		},
		TestOnBorrow: func(c redis.Conn, _ time.Time) error {
			if gen, _ := n.conns.Load(c); gen != n.gen.Load() {
				n.conns.Delete(c)
				return errors.New("dialled before a restart")
			}
			return nil
		},
	}
}

// rwPropNode is a node of TestRWProperty: a modelNode (for its server,
// crashes, partitions and pools) with a clock of its own.
type rwPropNode struct {
	*modelNode
	mu  sync.Mutex
	now time.Time // the server's clock (SetTime, with ClockTTL)
}

// tick moves the node's clock a microsecond: called before every call to
// the node.
func (n *rwPropNode) tick() {
	n.mu.Lock()
	n.now = n.now.Add(time.Microsecond)
	n.srv.SetTime(n.now)
	n.mu.Unlock()
}

func (n *rwPropNode) advance(d time.Duration) {
	n.mu.Lock()
	n.now = n.now.Add(d)
	n.srv.SetTime(n.now)
	n.mu.Unlock()
}

// nowMS is the node's TIME in milliseconds, as the scripts compute it.
func (n *rwPropNode) nowMS() int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.now.UnixMicro() / 1000
}
