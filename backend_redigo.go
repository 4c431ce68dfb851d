package netlock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
)

// NewRedigo returns a Backend that runs scripts on connections from pool.
// The pool is the caller's to configure and close. A call alone takes a
// connection with pool.GetContext and returns it when done. Calls made
// while others are in flight are pipelined on one more connection, dialed
// with the pool's Dial (or DialContext) function, kept out of the pool, and
// closed 2s after its last use; they take connections of the pool only
// while it is being dialed, or after a dial failed. A pool without a Dial
// function pipelines nothing: however many NetMutexes share the Backend,
// netlock has at most 128 calls in flight on it (the Hub bounds them), so a
// pool without a bound (MaxActive 0) keeps about as many connections at
// most for netlock.
//
// While waiters of the Backend are waiting for a lock, it keeps one more
// connection, dialed with the pool's Dial (or DialContext) function and kept
// out of the pool, subscribed to the release channels: it is closed shortly
// after the last wait ends. A pool without a Dial function is fine, its
// waiters poll. A LockCtx waiting when the pool is closed fails with an
// error matching ErrQuorum; a lock granted to it meanwhile is passed on to
// the next waiter over one more connection dialed with the pool's Dial
// function, closed at once.
func NewRedigo(pool *redis.Pool) Backend {
	if pool == nil {
		return nil // New names the nil backend
	}
	b := &redigoBackend{pool: pool}
	if pool.Dial != nil || pool.DialContext != nil {
		b.hub = NewHub(HubConfig{Listen: b.listen})
		b.mux = &redigoMux{pool: pool}
	}
	return b
}

type redigoBackend struct {
	pool     *redis.Pool
	hub      *Hub       // nil if the pool cannot dial
	mux      *redigoMux // nil if the pool cannot dial
	inFlight atomic.Int32
}

// Eval runs s by EVALSHA (EVAL on NOSCRIPT). A call made while another is
// in flight is pipelined with it on the Backend's own connection (see
// redigoMux); a call alone takes a connection of the pool.
func (b *redigoBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	argv := evalArgv(s, keys, args)
	alone := b.inFlight.Add(1) == 1
	defer b.inFlight.Add(-1)
	cmd := "EVALSHA"
	if !alone && b.mux != nil {
		reply, err, sent := b.mux.eval(ctx, argv)
		if sent && (err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT")) {
			if err != nil && ctx.Err() != nil {
				err = ctxErr(ctx) // as below
			}
			return redis.Int64s(reply, err)
		}
		if sent { // NOSCRIPT: EVAL with the source, on a connection of the pool
			cmd, argv[0] = "EVAL", s.Source()
		}
	}
	return b.evalPooled(ctx, s, cmd, argv)
}

// evalPooled runs cmd (EVALSHA or EVAL) argv on a connection of the pool,
// and EVAL after an EVALSHA's NOSCRIPT.
func (b *redigoBackend) evalPooled(ctx context.Context, s *Script, cmd string, argv []any) ([]int64, error) {
	conn, err := b.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return evalOn(ctx, conn, s, cmd, argv)
}

// evalOn runs cmd (EVALSHA or EVAL) argv on conn, and EVAL after an
// EVALSHA's NOSCRIPT.
func evalOn(ctx context.Context, conn redis.Conn, s *Script, cmd string, argv []any) ([]int64, error) {
	// redis.DoContext runs every command on a goroutine of its own, to
	// notice ctx's cancellation; that costs more than the round trip on a
	// busy machine. The command is bounded by ctx's deadline (netlock's
	// calls always have one: the node timeout) instead, so a cancellation
	// is noticed when the reply comes, within the node timeout.
	timeout, err := remaining(ctx)
	if err != nil {
		return nil, err
	}
	reply, err := redis.Int64s(redis.DoWithTimeout(conn, timeout, cmd, argv...))
	if err != nil && cmd == "EVALSHA" && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		argv[0] = s.Source()
		if timeout, err = remaining(ctx); err != nil {
			return nil, err
		}
		reply, err = redis.Int64s(redis.DoWithTimeout(conn, timeout, "EVAL", argv...))
	}
	if err != nil && ctx.Err() != nil {
		err = ctxErr(ctx)
	}
	return reply, err
}

// evalArgv returns the arguments of EVALSHA for s.
func evalArgv(s *Script, keys, args []string) []any {
	argv := make([]any, 0, 2+len(keys)+len(args))
	argv = append(argv, s.shaArg, len(keys))
	for _, k := range keys {
		argv = append(argv, k)
	}
	for _, a := range args {
		argv = append(argv, a)
	}
	return argv
}

// A redigoCall is a script call sent on a connection of the pool, whose
// reply is read later (see engine.fanoutPipelined): send and receive
// together do what Eval does.
type redigoCall struct {
	ctx  context.Context
	conn redis.Conn
	s    *Script
	argv []any
	err  error // taking the connection or sending failed
}

// ready reports whether a call sent now most likely takes no round trip
// before it is sent: the pool has an idle connection (no dial), and no
// TestOnBorrow function (which may PING it first).
func (b *redigoBackend) ready() bool {
	p := b.pool
	return p.TestOnBorrow == nil && p.TestOnBorrowContext == nil && p.IdleCount() > 0
}

// send sends s with EVALSHA on a connection of the pool, bounded by ctx,
// and returns without reading the reply.
func (b *redigoBackend) send(ctx context.Context, s *Script, keys, args []string) sentCall {
	c := &redigoCall{ctx: ctx, s: s}
	if c.conn, c.err = b.pool.GetContext(ctx); c.err != nil {
		return c
	}
	c.argv = evalArgv(s, keys, args)
	if c.err = c.conn.Send("EVALSHA", c.argv...); c.err == nil {
		c.err = c.conn.Flush()
	}
	return c
}

// receive reads the reply of the call send sent, bounded by its ctx's
// deadline (falling back to EVAL on NOSCRIPT, as Eval does), and returns
// the connection to the pool.
func (c *redigoCall) receive() ([]int64, error) {
	defer c.conn.Close()
	reply, err := c.reply()
	if err != nil && c.ctx.Err() != nil {
		err = ctxErr(c.ctx)
	}
	return reply, err
}

func (c *redigoCall) reply() ([]int64, error) {
	if c.err != nil {
		return nil, c.err
	}
	timeout, late := remaining(c.ctx)
	if late != nil {
		// ctx's deadline passed (or ctx ended) while the replies of other
		// nodes were read. A reply that has come meanwhile counts, as it
		// would have on a goroutine of its own: the read gets a moment
		// (an expired deadline would fail it without looking), and no
		// more. Read or timed out, the connection is then in step: back to
		// the pool, or closed (redigo closes a connection whose read
		// failed); left unread, the pool's Close would wait for the reply
		// without a bound.
		timeout = lateRead
	}
	reply, err := redis.Int64s(redis.ReceiveWithTimeout(c.conn, timeout))
	if err != nil && late != nil {
		return nil, late
	}
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		c.argv[0] = c.s.Source()
		if timeout, err = remaining(c.ctx); err != nil {
			return nil, err
		}
		reply, err = redis.Int64s(redis.DoWithTimeout(c.conn, timeout, "EVAL", c.argv...))
	}
	return reply, err
}

// lateRead is how long a redigoCall's receive waits for a reply once ctx's
// deadline has passed: long enough to read one that is there.
const lateRead = time.Millisecond

// EvalWait runs s as Eval does, then WAIT replicas on the same connection,
// sent together with the script (one round trip), and returns the script's
// reply and WAIT's count. Both are bounded by ctx's deadline.
func (b *redigoBackend) EvalWait(ctx context.Context, s *Script, keys, args []string, replicas int) ([]int64, int, error) {
	conn, err := b.pool.GetContext(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()

	argv := evalArgv(s, keys, args)
	reply, acked, err := redigoEvalWait(ctx, conn, "EVALSHA", argv, replicas)
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		argv[0] = s.Source()
		reply, acked, err = redigoEvalWait(ctx, conn, "EVAL", argv, replicas)
	}
	if err != nil && ctx.Err() != nil {
		err = ctxErr(ctx)
	}
	return reply, acked, err
}

// redigoEvalWait pipelines cmd argv and WAIT replicas on conn and reads
// both replies, each read bounded by ctx's deadline (as in Eval, without
// redis.DoContext's goroutine). A NOSCRIPT reply is returned as err; WAIT,
// which then waited for no write of ours, is read and dropped.
func redigoEvalWait(ctx context.Context, conn redis.Conn, cmd string, argv []any, replicas int) ([]int64, int, error) {
	if err := conn.Send(cmd, argv...); err != nil {
		return nil, 0, err
	}
	if err := conn.Send("WAIT", replicas, WaitTimeout(ctx).Milliseconds()); err != nil {
		return nil, 0, err
	}
	if err := conn.Flush(); err != nil {
		return nil, 0, err
	}
	timeout, err := remaining(ctx)
	if err != nil {
		return nil, 0, err
	}
	reply, err := redis.Int64s(redis.ReceiveWithTimeout(conn, timeout))
	var rerr redis.Error
	if err != nil && !errors.As(err, &rerr) {
		return nil, 0, err // the connection failed: WAIT's reply will not come
	}
	// After an error reply of the script, WAIT's reply still follows: it
	// is read, so that the connection goes back to the pool in step.
	timeout, werr := remaining(ctx)
	acked := 0
	if werr == nil {
		acked, werr = redis.Int(redis.ReceiveWithTimeout(conn, timeout))
	}
	if err != nil {
		return nil, 0, err
	}
	if werr != nil {
		return nil, 0, werr
	}
	return reply, acked, nil
}

// remaining returns the time left before ctx's deadline (0, no bound, if it
// has none), or ctx's error if it has ended.
func remaining(ctx context.Context) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	d := time.Until(dl)
	if d <= 0 {
		return 0, context.DeadlineExceeded
	}
	return d, nil
}

// Final reports whether err is an error reply of the server or means the
// pool was closed.
func (b *redigoBackend) Final(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) || strings.Contains(err.Error(), errPoolClosed)
}

// Hub returns the backend's Hub, which dials its pub/sub connection with
// the pool's Dial function (outside the pool: it is not returned to it, and
// does not count against MaxActive). It returns nil, so waiters poll, if the
// pool has no Dial function.
func (b *redigoBackend) Hub() *Hub { return b.hub }

func (*redigoBackend) boundsLazily() {}

func (b *redigoBackend) listen(ctx context.Context, onMessage func(channel, payload string)) (Listener, error) {
	conn, err := b.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &redigoPubSub{psc: redis.PubSubConn{Conn: conn}, onMessage: onMessage}, nil
}

// dial dials a connection with the pool's Dial (or DialContext) function,
// outside the pool.
func (b *redigoBackend) dial(ctx context.Context) (redis.Conn, error) {
	if p := b.pool; p.DialContext != nil {
		return p.DialContext(ctx)
	}
	return b.pool.Dial()
}

// errPoolClosed is the text of redigo's error for a Get on a closed pool.
const errPoolClosed = "get on closed pool"

// closed returns the pool's error if it has been closed (see closable).
// The Pool says so only to a Get: it is asked only when it has no idle
// connection (a closed pool has none), and a connection it gives goes back
// at once, for the hold's next call.
func (b *redigoBackend) closed(ctx context.Context) error {
	if b.pool.IdleCount() > 0 {
		return nil
	}
	conn, err := b.pool.GetContext(ctx)
	if err != nil {
		if strings.Contains(err.Error(), errPoolClosed) {
			return err
		}
		return nil // not closed; the hold's calls will find what else is wrong
	}
	conn.Close()
	return nil
}

// evalClosed runs s, as Eval does, on a connection dialed with the pool's
// Dial function and closed at once: for a grant that a waiter passes on
// after the pool was closed (see closable). The Hub's connection and
// redigoMux's are dialed so too.
func (b *redigoBackend) evalClosed(ctx context.Context, _ string, s *Script, keys, args []string) ([]int64, error) {
	conn, err := b.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return evalOn(ctx, conn, s, "EVALSHA", evalArgv(s, keys, args))
}

type redigoPubSub struct {
	psc       redis.PubSubConn
	onMessage func(channel, payload string)
}

func (c *redigoPubSub) Subscribe(_ context.Context, channel string) error {
	return c.psc.Subscribe(channel)
}

func (c *redigoPubSub) Unsubscribe(_ context.Context, channel string) error {
	return c.psc.Unsubscribe(channel)
}

func (c *redigoPubSub) Confirmed() (string, error) {
	for {
		// No read deadline: the connection idles while the lock is held,
		// however long that is. close ends the wait.
		switch v := c.psc.ReceiveWithTimeout(0).(type) {
		case redis.Message:
			c.onMessage(v.Channel, string(v.Data))
		case redis.Subscription:
			if v.Kind == "subscribe" {
				return v.Channel, nil
			}
		case error:
			return "", v
		}
	}
}

func (c *redigoPubSub) Close() { c.psc.Close() }
