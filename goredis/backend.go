package goredis

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
)

// errRing is what every Eval of a Backend made from a *redis.Ring returns.
var errRing = errors.New("netlock/goredis: a *redis.Ring is not one Redis deployment: it shards keys over independent servers " +
	"and moves a key to another when its server stops answering, so a lock on it would not exclude; " +
	"give netlock.New one Backend per server instead (a quorum)")

// New returns a netlock Backend that runs netlock's scripts on c: a
// *redis.Client (one server, or the primary that Sentinel names, from
// redis.NewFailoverClient) or a *redis.ClusterClient (a Redis Cluster). The
// client is the caller's to configure and to close; it should have
// Options.ContextTimeoutEnabled set (see the package documentation). New
// returns nil for a nil c, so that netlock.New names the nil backend.
//
// The Backend is safe for concurrent use. Besides netlock.Backend it
// implements netlock.Subscriber, whose Hub opens its pub/sub connection with
// c.Subscribe (for a *redis.ClusterClient, one per master, with the
// master's SSubscribe: see the package documentation);
// netlock.ErrorClassifier, for which an error reply of the server (a
// redis.Error) and a closed client (redis.ErrClosed) are final; and
// netlock.ReplicaWaiter, for netlock.WithSyncReplicas.
//
// For a *redis.Ring, New returns a Backend whose every Eval fails at once,
// with an error that says why (a Ring is not one deployment: see the
// package documentation), and that netlock reports at once rather than
// riding it out. Any other implementation of redis.UniversalClient is taken
// for one server: its Subscribe must open a pub/sub connection to the
// server its scripts run on.
func New(c redis.UniversalClient) netlock.Backend {
	b := &backend{client: c}
	switch c := c.(type) {
	case nil:
		return nil // netlock.New names the nil backend
	case *redis.Client:
		if c == nil {
			return nil
		}
		b.bounded = c.Options().ContextTimeoutEnabled
		b.pipe = &pipeline{c: c, eval: b.call, cmd: b.scriptCmd}
	case *redis.ClusterClient:
		if c == nil {
			return nil
		}
		b.bounded = c.Options().ContextTimeoutEnabled
		b.cluster = c
		b.masters = make(map[string]*redis.Client)
		b.hub = netlock.NewHub(netlock.HubConfig{Shard: b.shard, ListenShard: b.listenShard})
		return b
	case *redis.Ring:
		if c == nil {
			return nil
		}
		b.refused = errRing
		return b // no Hub: nothing is ever run on it
	}
	b.hub = netlock.NewHub(netlock.HubConfig{Listen: b.listen})
	return b
}

type backend struct {
	client redis.UniversalClient
	// bounded: the client applies a context's deadline to the socket
	// (Options.ContextTimeoutEnabled), so a command returns by ctx's
	// deadline by itself.
	bounded bool
	hub     *netlock.Hub // nil if refused
	refused error        // returned by every Eval; nil if the client is usable
	// pipe, for a *redis.Client, sends the calls that come while another
	// is in flight together, in one pipeline.
	pipe *pipeline

	// cluster is the client if it is a *redis.ClusterClient; masters holds
	// its masters' clients that shard has named, by address, for
	// listenShard.
	cluster   *redis.ClusterClient
	mastersMu sync.Mutex
	masters   map[string]*redis.Client

	shas  sync.Map // *netlock.Script → its SHA1, boxed: see sha
	boxes boxes    // the scripts' arguments, boxed
}

// boxes keeps the command arguments a Backend boxed lately (a string made
// an interface value for go-redis costs an allocation). Most of a lock's
// keys and arguments are the same at every call (its key, its queue's, the
// expiry); only the hold's value and tombstone differ. It keeps at most
// boxesMax and forgets them all when full: memory stays bounded whatever
// the number of lock names, and the arguments that repeat are boxed again
// once per boxesMax new ones.
type boxes struct {
	mu sync.Mutex
	m  map[string]any
}

const boxesMax = 1024

// fill sets dst to keys, then args, boxed.
func (c *boxes) fill(dst []any, keys, args []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]any, boxesMax)
	}
	for i, s := range keys {
		dst[i] = c.boxLocked(s)
	}
	for i, s := range args {
		dst[len(keys)+i] = c.boxLocked(s)
	}
}

func (c *boxes) boxLocked(s string) any {
	if v, ok := c.m[s]; ok {
		return v
	}
	if len(c.m) >= boxesMax {
		clear(c.m)
	}
	var v any = s
	c.m[s] = v
	return v
}

// Eval runs s with EVALSHA, falling back to EVAL when the server answers
// NOSCRIPT, and returns its reply. It returns ctx's error if ctx ends first.
//
// A client without Options.ContextTimeoutEnabled ignores ctx's deadline
// while it waits for a reply; then the command runs on a goroutine of its
// own and Eval returns when ctx ends, leaving the command to end when the
// reply comes or the client's ReadTimeout passes. With it, the command runs
// on the caller's goroutine: a cancellation of ctx without a deadline is
// then noticed when the reply comes (netlock's calls all have a deadline,
// the node timeout).
func (b *backend) Eval(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	if b.refused != nil {
		return nil, b.refused
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if b.pipe != nil {
		return b.pipe.run(ctx, s, keys, args)
	}
	return b.call(ctx, s, keys, args)
}

// call runs one script call on the client, as Eval describes.
func (b *backend) call(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	if b.bounded {
		return b.eval(ctx, s, keys, args)
	}
	type result struct {
		reply []int64
		err   error
	}
	// Buffered: the goroutine never blocks on a caller that has left.
	done := make(chan result, 1)
	go func() {
		reply, err := b.eval(ctx, s, keys, args)
		done <- result{reply, err}
	}()
	select {
	case r := <-done:
		return r.reply, r.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// EvalWait runs s as Eval does, then WAIT replicas, in one pipeline (one
// round trip, one connection, so that WAIT waits for the script's writes),
// and returns the script's reply and WAIT's count. On a
// *redis.ClusterClient the pipeline runs on the client of the node that
// serves the lock's slot (ClusterClient.MasterForKey): a cluster pipeline
// would send WAIT, which names no key, to any node. ctx bounds it as it
// bounds Eval.
func (b *backend) EvalWait(ctx context.Context, s *netlock.Script, keys, args []string, replicas int) ([]int64, int, error) {
	if b.refused != nil {
		return nil, 0, b.refused
	}
	if ctx.Err() != nil {
		return nil, 0, context.Cause(ctx)
	}
	if b.bounded {
		return b.evalWait(ctx, s, keys, args, replicas)
	}
	type result struct {
		reply []int64
		acked int
		err   error
	}
	done := make(chan result, 1) // as in Eval
	go func() {
		reply, acked, err := b.evalWait(ctx, s, keys, args, replicas)
		done <- result{reply, acked, err}
	}()
	select {
	case r := <-done:
		return r.reply, r.acked, r.err
	case <-ctx.Done():
		return nil, 0, context.Cause(ctx)
	}
}

func (b *backend) eval(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	cmd := b.scriptCmd(ctx, s, false, keys, args)
	_ = b.client.Process(ctx, cmd)
	reply, err := cmd.Result()
	if noScript(err) {
		cmd = b.scriptCmd(ctx, s, true, keys, args)
		_ = b.client.Process(ctx, cmd)
		reply, err = cmd.Result()
	}
	if err != nil && b.cluster != nil && errors.Is(err, syscall.ECONNREFUSED) {
		// The node that served the slot is gone (a master killed, its
		// replica taking over): have the client read the slots again.
		// With go-redis v9.23 a client left to itself kept dialing the
		// dead address for over a minute (TestClusterFailover/async).
		b.cluster.ReloadState(ctx)
	}
	return reply, ended(ctx, err)
}

// scriptCmd returns the command that runs s with keys and args: EVALSHA,
// or EVAL with the script's source. It is the command go-redis's EvalSha
// and Eval make, read as the array of integers that netlock's scripts
// return (an IntSliceCmd): no reply of boxed values to convert, and the
// script's SHA1 boxed once per Backend (see sha).
func (b *backend) scriptCmd(ctx context.Context, s *netlock.Script, source bool, keys, args []string) *redis.IntSliceCmd {
	argv := make([]any, 3+len(keys)+len(args))
	if source {
		argv[0], argv[1] = "eval", s.Source()
	} else {
		argv[0], argv[1] = "evalsha", b.sha(s)
	}
	argv[2] = len(keys)
	b.boxes.fill(argv[3:], keys, args)
	cmd := redis.NewIntSliceCmd(ctx, argv...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3) // a ClusterClient routes it by its first key
	}
	return cmd
}

// sha returns s's SHA1 as a command argument: boxed once, on first use.
func (b *backend) sha(s *netlock.Script) any {
	if v, ok := b.shas.Load(s); ok {
		return v
	}
	v, _ := b.shas.LoadOrStore(s, any(s.SHA1()))
	return v
}

// noScript reports whether err is the server's NOSCRIPT: the script is not
// in its cache (a fresh or flushed server), and runs again by EVAL.
func noScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// ended returns ctx's cause in place of err if ctx has ended, or its
// deadline has passed: a read cut short by the deadline fails with an i/o
// timeout, maybe a moment before ctx's own timer fires, and the caller's
// question is whether ctx ended.
func ended(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return err
}

func (b *backend) evalWait(ctx context.Context, s *netlock.Script, keys, args []string, replicas int) ([]int64, int, error) {
	var c redis.Cmdable = b.client
	if cc, ok := b.client.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, 0, err
		}
		c = node
	}
	reply, acked, err := b.pipeWait(ctx, c, s, false, keys, args, replicas)
	if cc, ok := b.client.(*redis.ClusterClient); ok && redis.HasErrorPrefix(err, "MOVED") {
		// The slot moved (a failover): the pipeline went to one node and
		// does not follow redirections. Once more, on the node named.
		cc.ReloadState(ctx)
		if node := masterAt(ctx, cc, movedTo(err)); node != nil {
			c = node
			reply, acked, err = b.pipeWait(ctx, c, s, false, keys, args, replicas)
		}
	}
	if noScript(err) {
		reply, acked, err = b.pipeWait(ctx, c, s, true, keys, args, replicas)
	}
	return reply, acked, ended(ctx, err)
}

// movedTo returns the address a MOVED error names, "" for another error.
func movedTo(err error) string {
	f := strings.Fields(err.Error())
	if len(f) == 3 && f[0] == "MOVED" {
		return f[2]
	}
	return ""
}

// masterAt returns the client of cc's master at addr, nil if cc does not
// know one there.
func masterAt(ctx context.Context, cc *redis.ClusterClient, addr string) *redis.Client {
	if addr == "" {
		return nil
	}
	var mu sync.Mutex
	var found *redis.Client
	_ = cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	return found
}

// pipeWait runs s (EVALSHA, or EVAL with source) and WAIT replicas in one
// pipeline of c and returns their replies; the script's error first.
func (b *backend) pipeWait(ctx context.Context, c redis.Cmdable, s *netlock.Script, source bool, keys, args []string, replicas int) ([]int64, int, error) {
	run := b.scriptCmd(ctx, s, source, keys, args)
	var wait *redis.Cmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		_ = p.Process(ctx, run)
		// Pipeliner has no Wait method; Wait's own read timeout would not
		// apply in a pipeline anyway, whose reads are bounded by ctx's
		// deadline and the client's ReadTimeout.
		wait = p.Do(ctx, "WAIT", replicas, netlock.WaitTimeout(ctx).Milliseconds())
		return nil
	})
	unanswered(run, err) // as in pipeline.pipe
	if wait.Err() == nil && wait.Val() == nil {
		wait.SetErr(err)
	}
	reply, err := run.Result()
	if err != nil {
		return nil, 0, err
	}
	acked, err := wait.Int64()
	if err != nil {
		return nil, 0, err
	}
	return reply, int(acked), nil
}

// Final reports whether err, returned by Eval, is final: an error reply of
// the server, a closed client, or the refusal of a *redis.Ring.
//
// A Redis Cluster's answers while its slots move (MOVED, ASK, TRYAGAIN,
// CLUSTERDOWN) are not final: a failover under way gives them, and the
// same call succeeds once it is over.
func (b *backend) Final(err error) bool {
	var reply redis.Error
	if errors.As(err, &reply) {
		return !clusterMoving(reply.Error())
	}
	return errors.Is(err, redis.ErrClosed) || errors.Is(err, errRing)
}

// clusterMoving reports whether msg, an error reply, is one a Redis Cluster
// gives while its slots move.
func clusterMoving(msg string) bool {
	for _, p := range []string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// Hub returns the Backend's Hub, whose pub/sub connections are opened with
// the client's Subscribe, or, for a *redis.ClusterClient, its masters'
// SSubscribe. It returns nil for a *redis.Ring.
func (b *backend) Hub() *netlock.Hub { return b.hub }
