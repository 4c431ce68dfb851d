package netlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// An Election elects one leader among the processes that campaign under one
// name, in order of arrival, as etcd's concurrency.Election does, over
// Redis. The leader publishes a value (its address, say) that every process
// can read (Leader) or follow (Observe); its term is a fencing token,
// strictly increasing from leader to leader, over a quorum too.
//
// Leadership is a hold of a lock of the election's own, taken and kept as a
// NetMutex's is: a campaigner waits in the lock's queue, woken by message
// when its turn comes; the leader's hold is extended while its process
// lives (WithAutoExtend) and expires when it dies, and its loss is told on
// Lost by the local clock. The options are New's; WithFencing(false) and
// WithMinHold are refused (the term is the fencing token; a leader that
// resigns makes way at once).
//
// An Election is one campaigner: its methods are safe for concurrent use,
// but one Campaign runs at a time. Processes (or goroutines) that campaign
// against each other use an Election each. An Election must be created
// with NewElection (or Client.Election) and must not be copied after first
// use.
type Election struct {
	m    *engine // the engine: its hold is the leadership
	keys keyspace.ElectionKeys
	// recordMS is the leader's record's TTL, recordExpiries, as the
	// scripts take it.
	recordMS string

	campaigning atomic.Bool // a Campaign is under way

	// mu orders Campaign's first value, Proclaim and Resign: each value of
	// a term has a revision of its own, one more than the last.
	mu   sync.Mutex
	term *hold  // the hold whose value was proclaimed; nil when not leading
	rev  uint64 // the revision of term's last value (see lua/elect_proclaim.lua)
}

// A Leader is who leads an Election: the value it campaigned with or last
// proclaimed, and its term. The zero Leader means that nobody leads.
type Leader struct {
	Value string
	// Term is the leadership's fencing token: it strictly increases from
	// one leader to the next, and stays the same across Proclaims.
	Term uint64
}

// MaxLeaderValue is the longest value, in bytes, a leader may campaign or
// proclaim with.
const MaxLeaderValue = 4096

// recordExpiries: the leader's record outlives its hold by up to ten
// expiries, so that a node whose leader is gone still tells which term
// ended (see lua/elect_read.lua). The leader's extends renew it.
const recordExpiries = 10

// electionKind is the kind of an Election's lock: a NetMutex's, whose
// release tells observers that the term ended and whose extend keeps the
// leader's record (lua/release.lua and lua/extend.lua, given the record's
// key).
type electionKind struct {
	mutexKind
	e *Election
}

func (electionKind) observed() Kind { return KindElection }

func (k electionKind) releaseCall(value, tomb string) (*Script, []string, []string) {
	s, keys, args := k.mutexKind.releaseCall(value, tomb)
	return s, append(keys[:len(keys):len(keys)], k.e.keys.Leader), args
}

func (k electionKind) extendCall(value string) (*Script, []string, []string) {
	m := k.m
	return extendScript, []string{m.keys.lock, m.keys.waiters, k.e.keys.Leader}, []string{value, m.expiryMS, m.queueMS, k.e.recordMS}
}

// Design. The leadership is the hold of a NetMutex-like lock,
// p{name}:elect, run by the engine (waiting, queue, watchdog, Lost, quorum
// and fencing are the engine's): its token is the term. Beside it, in the
// same hash slot, the leader's record p{name}:elect:leader holds the term,
// the value and its revision (1 for the campaign's value, one more per
// Proclaim, proposed by the leader so that every node numbers a value
// alike). A leader leads while the lock holds the token its record names.
// Campaign takes the hold, then records its value (lua/elect_proclaim.lua);
// between the two nobody is reported leading. Every change is published on
// p{name}:elect:changes: a value recorded ("l:term:rev:pttl:value", by
// elect_proclaim.lua) and a term ended by Resign ("n:term", by the
// release). A hold that expires publishes nothing: an observer learns of it
// from the lock's TTL, which it re-reads when it runs out (a leader that
// lives has extended it meanwhile), about one read per expiry while a
// leader leads, none while nobody does.

// NewElection returns the Election called name on backends: one backend, or
// the independent deployments of a quorum, whose majority elects the leader
// (as New's lock). It validates name, backends and options, as New does,
// and does not contact Redis. An Election and a NetMutex of the same name
// are different things.
func NewElection(name string, backends []Backend, opts ...Option) (*Election, error) {
	cfg, err := newCheckedConfig(name, backends, opts)
	if err != nil {
		return nil, err
	}
	switch {
	case !cfg.fencing:
		return nil, errors.New("netlock: an Election's term is its fencing token: WithFencing(false) does not apply")
	case cfg.minHold > 0:
		return nil, errors.New("netlock: an Election's leader makes way when it resigns: WithMinHold does not apply")
	}
	k := keyspace.Election(cfg.prefix, name)
	e := &Election{keys: k, recordMS: strconv.FormatInt(recordExpiries*cfg.expiry.Milliseconds(), 10)}
	cfg.handoffs = 0 // one campaigner per Election: nobody to hand to
	e.m, err = newEngine(name, backends, cfg, spec{
		keys: keys{lock: k.Lock, channel: k.Channel, waiters: k.Waiters, fence: k.Fence},
		kind: func(m *engine) kind { return electionKind{mutexKind{m}, e} },
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Election returns a new Election called name on c's backends, with c's
// options and opts. Elections are not shared: each is one campaigner. Its
// errors are NewElection's.
func (c *Client) Election(name string, opts ...Option) (*Election, error) {
	if c == nil || c.mutexes == nil {
		return nil, errZeroClient
	}
	return NewElection(name, c.backends, c.options(opts)...)
}

// Name returns the election's name.
func (e *Election) Name() string {
	if e == nil || e.m == nil {
		return ""
	}
	return e.m.name
}

// errZeroElection is returned by an Election not made by NewElection.
var errZeroElection = errors.New("netlock: Election not created by NewElection (the zero value is not usable)")

func (e *Election) check() error {
	if e == nil || e.m == nil {
		return errZeroElection
	}
	return nil
}

// checkValue returns what is wrong with a leader's value.
func checkValue(value string) error {
	switch {
	case value == "":
		return errors.New("netlock: empty leader value")
	case len(value) > MaxLeaderValue:
		return fmt.Errorf("netlock: leader value of %d bytes is longer than MaxLeaderValue (%d)", len(value), MaxLeaderValue)
	}
	return nil
}

// Campaign waits until this process leads the election, then makes value
// the leader's value, and returns nil. Campaigners are elected in order of
// arrival; while one waits it costs Redis one look at the leader's TTL per
// expiry, a few commands (its turn comes by message, see NetMutex.LockCtx).
//
// If ctx ends first, it returns an error matching ctx's error (and
// ErrNotObtained, or ErrQuorum if Redis did not answer the last attempt),
// and leaves nothing behind: no place in the queue, no leadership. If the
// value cannot be recorded on a quorum, the leadership is given up and the
// error returned; ErrLockLost if the leadership was lost as it began (the
// nodes so slow that its validity ran out). It returns an error at once for an empty or oversized
// value, while another Campaign of e runs, and while e leads (Proclaim
// changes the value); and, taking nothing, if the Backend's Redis user may
// not publish and subscribe on the election's channels (the error names the
// ACL rule to add: see docs/deployments.md).
func (e *Election) Campaign(ctx context.Context, value string) error {
	if err := e.check(); err != nil {
		return err
	}
	if err := checkValue(value); err != nil {
		return err
	}
	if !e.campaigning.CompareAndSwap(false, true) {
		return errors.New("netlock: Campaign: another Campaign of this Election is under way")
	}
	defer e.campaigning.Store(false)
	if e.leading() != nil {
		return errors.New("netlock: Campaign: this Election leads already (Proclaim changes its value)")
	}
	m := e.m
	if h := m.current(); h != nil {
		// A leadership lost before Resign: its hold is still m's.
		m.unlockCtx(context.WithoutCancel(ctx))
	}
	// The value is told on the election's channel, and its release would
	// be: a user who may not publish there is told so before it takes
	// anything (see engine.checkChannels).
	if err := m.checkChannels(ctx, nil); err != nil {
		return err
	}
	if err := m.lockCtx(ctx); err != nil {
		return err
	}
	h := m.current()
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.proclaim(ctx, h, 1, value)
	if err == nil && h.expire(m.clk.Now()) {
		err = ErrLockLost // the calls took the whole validity: lost as it began
	}
	if err != nil {
		m.unlockCtx(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return notObtained(join(context.Cause(ctx), err))
		}
		return err
	}
	e.term, e.rev = h, 1
	return nil
}

// leading returns the hold of the current term if e leads, nil otherwise.
func (e *Election) leading() *hold {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leadingLocked()
}

// leadingLocked is leading; the caller holds e.mu.
func (e *Election) leadingLocked() *hold {
	if e.term == nil || e.term != e.m.current() {
		return nil
	}
	if _, held := e.term.deadline(); !held {
		return nil
	}
	return e.term
}

// proclaim records value under revision rev on every node where h holds
// the lock, and returns what settle makes of the replies: ErrLockLost if
// the lock is no longer h's on too many nodes (then h is lost). The caller
// holds e.mu.
func (e *Election) proclaim(ctx context.Context, h *hold, rev uint64, value string) error {
	until, held := h.deadline()
	if !held {
		return ErrLockLost
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	keys := []string{e.keys.Lock, e.keys.Leader}
	args := []string{h.value, strconv.FormatUint(rev, 10), e.recordMS, value}
	err := e.m.settle(e.m.fanout(ctx, electProclaimScript, keys, args, nil))
	if errors.Is(err, ErrLockLost) {
		h.lose()
	}
	return err
}

// Proclaim makes value the leader's value, in the same term, and tells the
// observers. It returns ErrNotLeader if e does not lead (and, if e's
// leadership was found lost just now, ErrLockLost too); an error matching
// ErrQuorum if too few nodes recorded it (the value may then be seen on
// some: Proclaim again). ctx and the leadership's deadline bound the call.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	if err := e.check(); err != nil {
		return err
	}
	if err := checkValue(value); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.leadingLocked()
	if h == nil {
		return ErrNotLeader
	}
	// A revision is used once, whatever the outcome: a value that reached
	// some nodes only is never numbered like the next.
	e.rev++
	err := e.proclaim(ctx, h, e.rev, value)
	if errors.Is(err, ErrLockLost) {
		return join(ErrNotLeader, ErrLockLost)
	}
	return err
}

// Resign ends e's leadership, telling the observers that nobody leads, and
// gives the next campaigner its turn. It returns ErrNotLeader if e does not
// lead, and ErrLockLost if its leadership had been lost before (Lost was
// closed then). The release runs under a context detached from ctx's
// cancellation, as NetMutex.UnlockCtx's does; afterwards e does not lead,
// whatever Resign returns.
func (e *Election) Resign(ctx context.Context) error {
	if err := e.check(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.term
	e.term = nil
	if h == nil || h != e.m.current() {
		return ErrNotLeader
	}
	return e.m.unlockCtx(ctx)
}

// Lost returns a channel that is closed when e's leadership ends without
// Resign: its local deadline passed without a successful extend, or an
// extend or Proclaim found the lock gone or taken. It is also closed by
// Resign, so that a goroutine watching it ends with the term, as
// NetMutex.Lost is by Unlock. When e does not lead, Lost returns a closed
// channel.
func (e *Election) Lost() <-chan struct{} {
	if e == nil || e.m == nil {
		return closedChan
	}
	if h := e.leading(); h != nil {
		return h.lostChan()
	}
	return closedChan
}

// Term returns the term of e's leadership, 0 when e does not lead.
func (e *Election) Term() uint64 {
	if e == nil || e.m == nil {
		return 0
	}
	if h := e.leading(); h != nil {
		return h.token
	}
	return 0
}

// Leader returns who leads the election now, as a majority of the nodes
// tell: ErrNoLeader when nobody does; an error matching ErrQuorum if too
// few nodes answered to tell (a term led on fewer than a majority of the
// nodes that answered may be led on the majority with those that did not).
// It waits for nothing.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if err := e.check(); err != nil {
		return Leader{}, err
	}
	views := make([]nodeView, len(e.m.nodes))
	answered, errs := e.read(ctx, views, nil)
	l, v := majority(views, e.m.quorum)
	switch v {
	case leads:
		return l, nil
	case nobody:
		return Leader{}, ErrNoLeader
	}
	n := 0
	for _, a := range answered {
		if a {
			n++
		}
	}
	return Leader{}, &quorumError{nodes: len(e.m.nodes), answered: n, need: len(e.m.nodes), errs: errs}
}

// Observe returns a channel that delivers who leads the election: first
// the leader now (the zero Leader when nobody leads), then every change, as
// a majority of the nodes tell it: a new leader, a Proclaim's new value,
// and the zero Leader when a leader resigns or its hold expires. It learns
// of changes by message; of an expiry, which publishes nothing, from the
// lock's TTL, within about a node timeout of it (a read per expiry while a
// leader leads). A reader slower than the changes misses the states in
// between, never the latest; a term is never followed by an older one.
// The channel is closed when ctx ends. If Redis cannot be asked, Observe
// keeps trying (a failed read or subscription is tried again about every
// third of the expiry) and delivers nothing until it can.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader)
	if e.check() != nil {
		close(out)
		return out
	}
	o := newObserver(e, out)
	go o.run(ctx)
	return out
}
