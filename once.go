package netlock

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// A Once runs a function once across processes, as sync.Once does within
// one: a migration when ten pods start, a report once per tick of a
// schedule on one of three replicas (a Once per tick; see docs/usage.md).
// Do runs the function unless it already ran to success under the Once's
// name; success is remembered until Forget, or for WithRemember's duration.
//
// One caller at a time, in any process, runs the function, under a lock of
// the Once's own, taken, waited for and kept as a NetMutex's is (the same
// queue, messages, watchdog, quorum and fencing); the callers that come
// meanwhile wait in its queue. The runner's hold records the success
// itself, in a script that checks that the lock still holds the hold's
// value and fencing token, so that a runner whose hold was lost records
// nothing. Each caller reads the record before it waits (a name done costs
// one round trip) and again once it holds the lock. The options are
// New's, with WithRemember; WithMinHold is refused (the callers waiting
// learn of a run when it ends). A Once and a NetMutex of the same name are
// different locks.
//
// A Once is safe for concurrent use: goroutines that share it queue
// locally first, as a NetMutex's do. It must be created with NewOnce (or
// Client.Once) and must not be copied after first use.
type Once struct {
	m    *NetMutex // the engine: its hold is the right to run the function
	keys keyspace.OnceKeys
	// rememberMS is WithRemember's duration in milliseconds, as
	// lua/once_record.lua takes it: "0" until Forget.
	rememberMS string
}

// Design. The lock is a NetMutex's, p{name}:once, run by the engine as is
// (waiting, queue, watchdog, local hand-off, quorum, fencing); only its
// keys and the Kind its events carry are its own. Beside it, in the same
// hash slot, the record p{name}:once:done says that the function ran to
// success: "<token>:<unix ms>:<holder>", written by lua/once_record.lua
// only where the lock holds the runner's value and token, and counted done
// when a quorum of the nodes hold it. Once a quorum does, it is copied to
// the nodes that answered but did not hold the runner's hold (a quorum hold
// need not be on every node), so that Done still tells with a node of the
// quorum down. The record is written by a script of its own, before the
// release, not by the release: so the hold is released as every hold is
// (hand-off to the next waiter, local or in Redis, a release delivered
// again in the background), and a hold handed to a goroutine of this
// process, which no script sees, finds the record all the same. Each
// waiter, when its turn comes, reads the record and gives the lock on: a
// run that succeeded releases its waiters a few round trips apart, in
// their order of arrival.

// onceKind is the kind of a Once's lock: a NetMutex's, under its own keys,
// whose events an Observer sees as KindOnce.
type onceKind struct {
	mutexKind
}

func (onceKind) observed() Kind { return KindOnce }

// onceConfig is the Option NewOnce adds to the caller's: it lets
// WithRemember through, which every other constructor refuses.
func onceConfig(c *config) { c.once.forOnce = true }

// NewOnce returns the Once called name on backends: one backend, or the
// independent deployments of a quorum, on a majority of which a run holds
// the lock and records its success (as New's lock). It validates name,
// backends and options, as New does, and does not contact Redis.
func NewOnce(name string, backends []Backend, opts ...Option) (*Once, error) {
	cfg, err := newCheckedConfig(name, backends, append(opts[:len(opts):len(opts)], onceConfig))
	if err != nil {
		return nil, err
	}
	if cfg.minHold > 0 {
		return nil, errors.New("netlock: a Once's waiters learn of a run when it ends: WithMinHold does not apply")
	}
	k := keyspace.Once(cfg.prefix, name, cfg.fencing)
	m, err := newEngine(name, backends, cfg, spec{
		keys: keys{lock: k.Lock, channel: k.Channel, waiters: k.Waiters, fence: k.Fence},
		kind: func(m *engine) kind { return onceKind{mutexKind{m}} },
	})
	if err != nil {
		return nil, err
	}
	o := &Once{m: &NetMutex{m}, keys: k, rememberMS: strconv.FormatInt(cfg.once.remember.Milliseconds(), 10)}
	return o, nil
}

// Name returns the Once's name.
func (o *Once) Name() string {
	if o == nil || o.m == nil {
		return ""
	}
	return o.m.name
}

// errZeroOnce is returned by a Once not made by NewOnce or Client.Once.
var errZeroOnce = errors.New("netlock: Once not created by NewOnce or Client.Once (the zero value is not usable)")

func (o *Once) check() error {
	if o == nil || o.m == nil {
		return errZeroOnce
	}
	return nil
}

// Do runs fn unless it already ran to success under o's name, and reports
// whether this call ran it. It blocks while another caller, in any
// process, runs fn: then it returns (false, nil) if that run succeeded, or
// runs fn itself if that run failed or its runner lost the lock (died,
// stalled past the expiry). ctx bounds the wait; its errors are LockCtx's
// (ErrNotObtained with ctx's error, ErrQuorum), and fn has not run.
//
// fn runs under the Once's lock, with a context that is cancelled when the
// hold is lost (its cause matching ErrLockLost) or ctx ends. If fn returns
// nil, its success is recorded by the hold, then the lock released, and Do
// returns (true, nil). If fn returns an error, Do returns true and that
// error, joined with the release's (ErrLockLost if the hold was lost while
// fn ran), and the next caller runs fn. If fn succeeds but its success
// cannot be recorded (the hold was lost: ErrLockLost; too few nodes
// answered: ErrQuorum), Do returns true and that error, and the next
// caller runs fn again. If fn panics, the lock is released and the panic
// goes on. A Do of a name done costs one round trip to Redis; Do returns
// an error at once for a nil fn.
func (o *Once) Do(ctx context.Context, fn func(ctx context.Context) error) (ran bool, err error) {
	if err := o.check(); err != nil {
		return false, err
	}
	if fn == nil {
		return false, errors.New("netlock: Once.Do: nil function")
	}
	if ctx.Err() != nil {
		return false, notObtained(context.Cause(ctx))
	}
	// A name done needs no lock. A read that failed is the wait's to ride
	// out, unless ctx ended.
	if done, err := o.done(ctx); done || (err != nil && ctx.Err() != nil) {
		return false, err
	}
	m := o.m
	if err := m.LockCtx(ctx); err != nil {
		return false, err
	}
	// A run may have ended while we waited: read again, under the hold.
	h := m.current()
	if done, err := o.done(ctx); done || err != nil {
		m.UnlockCtx(context.WithoutCancel(ctx))
		return false, err
	}
	return true, o.run(ctx, h, fn)
}

// run runs fn under h, the hold of o's lock, records its success, and
// releases h, whatever fn does. It returns fn's error joined with the
// release's, or the record's.
func (o *Once) run(ctx context.Context, h *hold, fn func(ctx context.Context) error) (err error) {
	m := o.m
	fctx, stop := m.whileHeld(ctx, h)
	recorded := false
	defer func() {
		// Runs on return and on panic; a panic goes on after the release.
		stop()
		uerr := m.UnlockCtx(context.WithoutCancel(ctx))
		// After the record, the run is done whatever the release does: a
		// release that did not reach every node is delivered again in the
		// background, and a hold lost since excludes no one any more. A
		// record refused because the hold was lost said so already.
		if !recorded && !errors.Is(err, ErrLockLost) {
			err = join(err, uerr)
		}
	}()
	if err = fn(fctx); err != nil {
		return err
	}
	if err = o.record(ctx, h); err == nil {
		recorded = true
	}
	return err
}

// record records on every node that h's run succeeded, where the lock
// still holds h, and returns what settle makes of the replies: nil when a
// quorum recorded it, ErrLockLost when too many no longer hold h (then h
// is lost). It is not sent for a hold lost already. The call is detached
// from ctx's cancellation, as a release is (a run that succeeded is worth
// recording), and bounded by h's deadline.
func (o *Once) record(ctx context.Context, h *hold) error {
	m := o.m
	until, held := h.deadline()
	if !held || h.expire(m.clk.Now()) {
		return ErrLockLost
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	defer cancel()
	keys := []string{o.keys.Lock, o.keys.Done}
	args := []string{h.value, strconv.FormatUint(h.token, 10), o.rememberMS, m.holder, "0"}
	replies := m.fanout(rctx, onceRecordScript, keys, args, nil)
	err := m.settle(replies)
	switch {
	case errors.Is(err, ErrLockLost):
		h.lose()
	case err == nil:
		// Recorded on a quorum: the run is done. The nodes of the quorum
		// that did not grant h (a quorum hold need not be on every node)
		// get the record too, so that Done still tells with one of those
		// that have it down.
		var missed []bool
		for i, r := range replies {
			if r.err == nil && r.vals[0] != releaseDone {
				if missed == nil {
					missed = make([]bool, len(replies))
				}
				missed[i] = true
			}
		}
		if missed != nil {
			args[len(args)-1] = "1"
			m.fanout(rctx, onceRecordScript, keys, args, missed)
		}
	}
	return err
}

// Done reports whether o's function ran to success and is remembered: a
// quorum of the nodes hold the record of a run. It reads, waiting for
// nothing; ctx bounds it. It returns an error matching ErrQuorum when too
// few nodes answered to tell (and ctx's error too, if ctx ended).
func (o *Once) Done(ctx context.Context) (bool, error) {
	if err := o.check(); err != nil {
		return false, err
	}
	return o.done(ctx)
}

// done reads the record on every node, one round trip, and judges the
// replies over o's quorum.
func (o *Once) done(ctx context.Context) (bool, error) {
	m := o.m
	replies := m.fanout(ctx, onceReadScript, []string{o.keys.Done}, nil, nil)
	yes, no := 0, 0
	var errs []error
	for _, r := range replies {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.vals[0] == 1:
			yes++
		default:
			no++
		}
	}
	switch {
	case yes >= m.quorum:
		return true, nil
	case no > len(replies)-m.quorum:
		return false, nil // no quorum can hold it
	}
	return false, withCause(ctx, &quorumError{nodes: len(replies), answered: yes + no, need: len(replies), errs: errs})
}

// Forget forgets that o's function ran: the next Do runs it again (a Do
// waiting meanwhile for a run under way still returns after that run, if
// it succeeds). It deletes the record on every node, and returns an error
// matching ErrQuorum if fewer than a quorum answered (the record may then
// be left where it was: Forget again). ctx bounds it.
func (o *Once) Forget(ctx context.Context) error {
	if err := o.check(); err != nil {
		return err
	}
	m := o.m
	err := m.settle(m.fanout(ctx, onceForgetScript, []string{o.keys.Done}, nil, nil))
	if err != nil {
		return withCause(ctx, err)
	}
	return nil
}

// withCause returns err joined with ctx's cause if ctx ended, so that both
// match; err itself otherwise.
func withCause(ctx context.Context, err error) error {
	if cause := ctxEnded(ctx); cause != nil {
		return join(err, cause)
	}
	return err
}

// Once returns a Once called name on c's backends, with c's options and
// opts. Without opts, it returns the Once a goroutine of this process got
// for name and still uses, if any, so that they share it (as Mutex shares
// a NetMutex); with opts (WithRemember, say), a Once of its own. Its errors
// are NewOnce's.
func (c *Client) Once(name string, opts ...Option) (*Once, error) {
	if len(opts) > 0 {
		if c == nil || c.mutexes == nil {
			return nil, errZeroClient
		}
		return NewOnce(name, c.backends, c.options(opts)...)
	}
	return shared(c, c.onces, name, func() (*Once, error) { return NewOnce(name, c.backends, c.opts...) })
}

// OnceInfo is what Once.Inspect found: whether the function ran to
// success, which run recorded it, and the run under way, if any.
type OnceInfo struct {
	// Done reports whether the function ran to success and is remembered:
	// a quorum of the nodes hold the record of a run, as Done tells.
	Done bool

	// Token, At and HolderInfo are the recorded run's, when Done: its
	// fencing token (0 with fencing off), when it was recorded (by the
	// clock of the node that recorded it), and its holder's identity
	// (WithHolderInfo). Of several runs recorded on different nodes, the
	// latest (the highest token).
	Token      uint64
	At         time.Time
	HolderInfo string

	// TTL is how long the run is remembered still (WithRemember), by the
	// node's clock; negative when it is remembered until Forget, 0 when
	// not Done.
	TTL time.Duration

	// Running is the Once's lock, as Inspect tells a NetMutex's:
	// Running.Held while a caller runs the function (or reads the record,
	// its turn come).
	Running Info
}

// Inspect reads what o's record and lock hold on every node, writing
// nothing and waiting for nothing, as Inspect does for a NetMutex. It
// returns an error matching ErrQuorum when too few nodes answered to tell
// whether the function is done or whether a run is under way (with what
// could be read).
func (o *Once) Inspect(ctx context.Context) (OnceInfo, error) {
	if err := o.check(); err != nil {
		return OnceInfo{}, err
	}
	var info OnceInfo
	running, lerr := o.m.inspect(ctx)
	info.Running = running
	replies := o.m.fanout(ctx, onceInspectScript, []string{o.keys.Done}, nil, nil)
	rerr := o.judgeRecords(&info, replies)
	if rerr != nil {
		rerr = withCause(ctx, rerr)
	}
	return info, join(rerr, lerr)
}

// judgeRecords sets info's Done and the recorded run from the nodes'
// replies to lua/once_inspect.lua, by Done's rule, and returns an error
// when the nodes that answered cannot tell.
func (o *Once) judgeRecords(info *OnceInfo, replies []nodeReply) error {
	yes, no := 0, 0
	var errs []error
	for i, r := range replies {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.vals[0] == 0:
			no++
		default:
			yes++
			if err := info.take(r.vals); err != nil {
				errs = append(errs, nodeError(i, err))
			}
		}
	}
	switch {
	case yes >= o.m.quorum:
		info.Done = true
		return nil
	case no > len(replies)-o.m.quorum:
		info.Token, info.At, info.HolderInfo, info.TTL = 0, time.Time{}, "", 0
		return nil
	}
	return &quorumError{nodes: len(replies), answered: yes + no, need: len(replies), errs: errs}
}

// take makes the run a node's reply to lua/once_inspect.lua records info's,
// if it is later than the one info has.
func (info *OnceInfo) take(vals []int64) error {
	if vals[0] != 1 {
		return nil // a value netlock did not write: done, by whom unknown
	}
	if len(vals) < 5 {
		return errors.New("once_inspect script: unexpected reply")
	}
	who, ok := unpackAll(vals[4:])
	if !ok {
		return errors.New("once_inspect script: unexpected reply")
	}
	if token := uint64(vals[1]); info.At.IsZero() || token > info.Token {
		info.Token, info.At = token, time.UnixMilli(vals[2])
		info.HolderInfo = keyspace.HolderDecode(who)
		info.TTL = time.Duration(vals[3]) * time.Millisecond
		if vals[3] < 0 {
			info.TTL = -1
		}
	}
	return nil
}
