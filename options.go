package netlock

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Defaults of the options.
const (
	DefaultExpiry        = 8 * time.Second
	DefaultDriftFactor   = 0.01
	DefaultPrefix        = "netlock:"
	DefaultMinRetryDelay = 1 * time.Millisecond
	DefaultMaxRetryDelay = 50 * time.Millisecond
	// DefaultNodeTimeout bounds one call to one node, unless the expiry is
	// short: then the bound is a tenth of the expiry.
	DefaultNodeTimeout = 500 * time.Millisecond
	// DefaultLocalHandoffs bounds how many times in a row Unlock passes a
	// hold to a goroutine of this process waiting on the same NetMutex.
	DefaultLocalHandoffs = 16
	// MaxHolderInfo is the longest holder identity WithHolderInfo takes, in
	// bytes.
	MaxHolderInfo = 256
)

// Numbers of the algorithms, each with its reason, used by Go and passed to
// the Lua scripts as arguments.
const (
	// extendsPerExpiry: the watchdog extends every expiry/3, so that two
	// extends in a row may fail (a node restarting, a slow network) before
	// the hold is lost.
	extendsPerExpiry = 3
	// extendJitter: each extend falls at random in the last quarter of the
	// interval before it is due, (expiry/3)·3/4 to expiry/3 after the one
	// before, so that holds taken at once drift apart (see nextExtend). A
	// hold is then extended 8/7 times as often as every expiry/3.
	extendJitter = 4
	// failedExtendRetries: after a failed extend, the next is tried
	// (expiry/3)/8 later, so about eight more tries fit before the deadline.
	failedExtendRetries = 8
	// tombstoneExpiries: a released value's tombstone lives ten expiries,
	// longer than any request of ours can plausibly be stuck in a stalled
	// node; the reaper gives up delivering a release after as long, when a
	// late acquire could no longer take the key anyway.
	tombstoneExpiries = 10
	// queueExpiries: the waiters' queue outlives its last change or extend
	// by ten expiries, so that waiters keep their places while they wait,
	// yet the queue of a lock nobody uses any more goes away.
	queueExpiries = 10
	// releaseWakeTries bounds the waiters a release (or a waiter leaving
	// after its turn came) tries in a row: a waiter nobody listens for (its
	// process died) is skipped, up to this many.
	releaseWakeTries = 8
)

// An Option configures a NetMutex. Options are applied and validated once, by
// New; the resolved configuration never changes afterwards.
type Option func(*config)

// config is the resolved, validated configuration of a NetMutex.
type config struct {
	expiry        time.Duration
	autoExtend    bool
	minRetryDelay time.Duration
	maxRetryDelay time.Duration
	driftFactor   float64
	nodeTimeout   time.Duration // 0 until resolved
	prefix        string
	fencing       bool
	handoffs      int
	outage        time.Duration // the expiry unless outageSet
	outageSet     bool
	logger        *slog.Logger // nil: slog.Default(), Warn and above
	loggerSet     bool
	observer      Observer
	replicas      int           // WithSyncReplicas; 0: off
	maxHold       time.Duration // WithMaxHold; 0: no bound
	minHold       time.Duration // WithMinHold; 0: none
	holderInfo    string        // WithHolderInfo, as given
	once          onceOptions
}

// onceOptions are the options of a Once.
type onceOptions struct {
	remember    time.Duration // WithRemember; 0: until Forget
	rememberSet bool
	// forOnce: the config of a Once, the one kind WithRemember applies to
	// (NewOnce adds it; see onceConfig).
	forOnce bool
}

func defaultConfig() config {
	return config{
		expiry:        DefaultExpiry,
		autoExtend:    true,
		minRetryDelay: DefaultMinRetryDelay,
		maxRetryDelay: DefaultMaxRetryDelay,
		driftFactor:   DefaultDriftFactor,
		prefix:        DefaultPrefix,
		fencing:       true,
		handoffs:      DefaultLocalHandoffs,
		holderInfo:    defaultHolderInfo(),
	}
}

// defaultHolderInfo is "<hostname>/<pid>", made to pass checkHolderInfo:
// a byte it refuses becomes '?', and a long host name is cut.
var defaultHolderInfo = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	pid := "/" + strconv.Itoa(os.Getpid())
	host = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, host)
	if len(host)+len(pid) > MaxHolderInfo {
		host = strings.ToValidUTF8(host[:MaxHolderInfo-len(pid)], "?")
	}
	return host + pid
})

// WithExpiry sets the TTL of the lock key (default 8s). With auto-extend on,
// it is how long a hold survives its process dying; with it off, how long a
// hold lasts unless ExtendCtx is called.
func WithExpiry(d time.Duration) Option { return func(c *config) { c.expiry = d } }

// WithAutoExtend turns the watchdog on or off (default on). While on, a held
// NetMutex extends its key about every third of the expiry (at random in the
// last quarter before it, so that locks taken together are not extended
// together), so it does not expire while its process lives; Lost is closed
// if an extend cannot succeed before the hold's local deadline.
func WithAutoExtend(on bool) Option { return func(c *config) { c.autoExtend = on } }

// WithMaxHold bounds how long a hold lasts (default: no bound). At d after
// the acquire began the hold ends: the watchdog extends it no more, Lost()
// closes (LostMaxHold), the context Do gives fn ends with a cause matching
// ErrLockLost that names the bound, and ExtendCtx and UnlockCtx return
// ErrLockLost (UnlockCtx still deletes the key). No extend is sent after d,
// so the key, if the holder does not unlock, expires at the latest one
// expiry after d (and the moment the last extend took to reach Redis):
// other processes get in then even if the holder's process
// hangs on to it. It bounds every hold of the lock: a NetRWMutex's write
// lock and each read lease, and a Semaphore's lease. d must not be negative;
// 0 means no bound.
func WithMaxHold(d time.Duration) Option { return func(c *config) { c.maxHold = d } }

// WithMinHold makes a NetMutex's hold exclude others for at least d after
// its acquire began (default 0: none), for work that must run at most once
// per interval, on whichever process (as ShedLock's lockAtLeastFor): an
// UnlockCtx before d leaves the key, set to expire when d is over, instead
// of deleting it, and waiters get in then; this process's own next acquire
// waits too. An UnlockCtx after d releases at once. A hold handed to a
// goroutine of this process (WithLocalHandoffs) goes on as usual. For a
// NetRWMutex it bounds the write lock (a read lease ends when its last
// reader leaves); NewSemaphore refuses it. d must not be negative.
func WithMinHold(d time.Duration) Option { return func(c *config) { c.minHold = d } }

// WithHolderInfo sets the identity written with every hold (default
// "<hostname>/<pid>"), at no extra round trip: Inspect reports it
// (Info.HolderInfo), as do the netlock command's status and list. A hold a
// release grants to a waiter carries the waiter's; a NetRWMutex's read
// leases and a Semaphore's leases carry their process's. s must be at most
// MaxHolderInfo bytes of printable UTF-8 (no newline or tab); "" writes none.
func WithHolderInfo(s string) Option { return func(c *config) { c.holderInfo = s } }

// WithRemember sets how long a Once remembers that its function ran to
// success (default 0: until Forget): d after the run, the next Do runs it
// again. Only NewOnce and Client.Once take it; the other constructors, and
// NewClient, refuse it. d must not be negative, nor below Redis's
// millisecond.
func WithRemember(d time.Duration) Option {
	return func(c *config) { c.once.remember, c.once.rememberSet = d, true }
}

// WithRetryDelay bounds the jittered wait between acquire attempts where a
// waiter cannot be told its turn (defaults 1ms and 50ms): a Backend without
// pub/sub, a subscription that could not be made, and Redis not answering
// (see WithOutageWindow). The wait grows from min towards max with each
// failed attempt and never exceeds the holder's remaining TTL. A waiter that
// listens for its turn does not poll, whatever these are.
func WithRetryDelay(min, max time.Duration) Option {
	return func(c *config) { c.minRetryDelay, c.maxRetryDelay = min, max }
}

// WithDriftFactor sets the clock drift allowance, as a fraction of the expiry
// (default 0.01), subtracted from every hold's validity.
func WithDriftFactor(f float64) Option { return func(c *config) { c.driftFactor = f } }

// WithNodeTimeout bounds each call to one node (default 500ms, or a tenth of
// the expiry if that is smaller). It must be below the expiry.
func WithNodeTimeout(d time.Duration) Option { return func(c *config) { c.nodeTimeout = d } }

// WithPrefix sets the prefix of every Redis key and channel the NetMutex uses
// (default "netlock:"). It must not contain '{' or '}', which netlock uses as
// the Redis Cluster hash tag around the name.
func WithPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithFencing turns fencing tokens on or off (default on). With fencing off,
// Token returns 0 and no counter key is kept.
func WithFencing(on bool) Option { return func(c *config) { c.fencing = on } }

// WithLocalHandoffs bounds the hand-offs in a row (default 16; 0 turns them
// off). When goroutines of this process wait on the same NetMutex, Unlock
// passes the still-valid hold to the first of them without a round trip to
// Redis: it keeps its key, its fencing token and its Lost channel. After n
// hand-offs in a row, Unlock releases the lock in Redis instead, so clients
// in other processes get their turn. Hand-offs need auto-extend, which keeps
// the hold's validity up; with it off, every Unlock releases. A Semaphore's
// Release hands permits on to the goroutines of its process the same way,
// at most n times in a row between two grants from Redis.
func WithLocalHandoffs(n int) Option { return func(c *config) { c.handoffs = n } }

// WithOutageWindow sets how long a waiting LockCtx or Lock rides out Redis
// not answering (connections refused or reset, a server loading its data
// after a restart, calls slower than the node timeout, a pool exhausted):
// default the expiry. Within the window it keeps trying, with the retry
// delay between attempts; once the nodes have failed for d in a row it
// returns (Lock panics with) an error matching ErrQuorum that names each
// node's last error. 0 reports the first failure at once. An error reply
// that retrying cannot change (a key of another type, a missing permission)
// is reported at once, and TryLock and TryLockCtx never retry.
func WithOutageWindow(d time.Duration) Option {
	return func(c *config) { c.outage, c.outageSet = d, true }
}

// WithLogger sets where a NetMutex logs. At Warn: a hold lost, a release
// that could not be delivered to every node (it is delivered again in the
// background), the background delivery giving up, and a server whose
// settings break the lock (a maxmemory-policy that can evict lock keys;
// looked at once per Backend, before the first acquire, when Warn is
// enabled). At Debug: every acquire, unlock and extend. Records carry the
// attributes lock (the name), token, and node or error where they apply.
// Without this option, records at Warn and above go to slog.Default(),
// whichever logger that is when they are logged; pass
// slog.New(slog.DiscardHandler) to log nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger, c.loggerSet = l, true }
}

// WithObserver sets the Observer told of the NetMutex's acquires, unlocks,
// extends and lost holds (default none).
func WithObserver(o Observer) Option { return func(c *config) { c.observer = o } }

// WithSyncReplicas makes every acquire and extend wait, on each node, until
// n replicas of the node's server have acknowledged the script's writes
// (Redis's WAIT, on the connection that ran the script, bounded by the node
// timeout). 0, the default, turns it off. Every Backend must then be a
// ReplicaWaiter (NewRedigo, NewRueidis and netlock/goredis are), or New
// returns an error naming the one that is not.
//
// Replication in Redis is asynchronous: a lock a primary acknowledged may
// be missing from the replica a failover promotes, and another client can
// then take it while you hold it. With n ≥ 1, a hold acknowledged to you is
// on at least n replicas (on each node of a quorum that counted it), so a
// failover that promotes one of them keeps it. An acquire that too few
// replicas acknowledge in time is undone and fails at once with an error
// matching ErrNotReplicated that names the node and the count; an extend
// that too few acknowledge does not count (the hold is lost at its local
// deadline unless a later extend succeeds).
//
// It does not make Redis strongly consistent. WAIT counts the replicas that
// have the write; a failover may promote another. With more replicas than
// n, one that had not acknowledged can be chosen: Redis Sentinel and
// Cluster prefer the replica with the most data, which makes an
// acknowledging one likely, not certain (a replica that acknowledged may be
// the one that is cut off, and a failover forced while the old primary
// still takes writes lets writes be acknowledged by a replica that is about
// to follow the new primary and drop them). A primary that restarts without
// persistence and resyncs its replicas from its empty data set loses the
// hold too. Fencing tokens (Token) remain the way to make the protected
// resource safe.
//
// WAIT is given the node timeout less a margin (see WaitTimeout), since
// Redis applies WAIT's timeout only at its next cron tick, up to 100ms late
// at the default hz. With the default node timeout of 500ms, replicas that
// do not acknowledge in time are reported as ErrNotReplicated; with a node
// timeout much below 400ms, WAIT's answer may come after the call's
// deadline, and they are reported (and ridden out, by LockCtx) as a node
// that did not answer in time. Either way nothing is held.
//
// The cost: one WAIT per acquire and extend, which returns as soon as n
// replicas have acknowledged (a round trip to the replicas); with a replica
// down or stalled, every acquire fails after about the node timeout, and so
// it does while a replica that has just synced is not yet counted by its
// primary (until the primary's next cron tick; with a diskless sync, until
// the replica's first acknowledgement, up to a second). A
// release no longer grants the lock to the next waiter in its own script
// (nor a NetRWMutex's write lock or read leases: that write would be
// acknowledged to nobody): the waiter is woken and
// acquires itself, so a hand-over between processes takes one round trip
// more. Release, and the hand-off between goroutines of one process, do not
// wait.
func WithSyncReplicas(n int) Option { return func(c *config) { c.replicas = n } }

// newConfig applies opts over the defaults and validates the result.
func newConfig(opts []Option) (config, error) {
	c := defaultConfig()
	for i, o := range opts {
		if o == nil {
			return c, fmt.Errorf("netlock: option %d is nil", i)
		}
		o(&c)
	}
	errs := append(c.checkTimes(), c.checkRest()...)
	if len(errs) > 0 {
		return c, errors.New("netlock: bad options: " + strings.Join(errs, "; "))
	}
	return c, nil
}

// checkTimes checks the options that are durations, and sets the node
// timeout and outage window where they were left to their defaults. It
// returns what is wrong.
func (c *config) checkTimes() (errs []string) {
	if c.expiry <= 0 {
		errs = append(errs, fmt.Sprintf("expiry %v is not positive", c.expiry))
	} else if c.expiry < time.Millisecond {
		errs = append(errs, fmt.Sprintf("expiry %v is below Redis's 1ms resolution", c.expiry))
	}
	if !(c.driftFactor >= 0 && c.driftFactor < 0.5) { // also rejects NaN
		errs = append(errs, fmt.Sprintf("drift factor %v is outside [0, 0.5)", c.driftFactor))
	}
	if c.minRetryDelay <= 0 {
		errs = append(errs, fmt.Sprintf("minimum retry delay %v is not positive", c.minRetryDelay))
	}
	if c.maxRetryDelay < c.minRetryDelay {
		errs = append(errs, fmt.Sprintf("maximum retry delay %v is below the minimum %v", c.maxRetryDelay, c.minRetryDelay))
	}
	if c.nodeTimeout == 0 {
		c.nodeTimeout = min(DefaultNodeTimeout, c.expiry/10)
	} else if c.nodeTimeout < 0 {
		errs = append(errs, fmt.Sprintf("node timeout %v is not positive", c.nodeTimeout))
	} else if c.nodeTimeout >= c.expiry {
		errs = append(errs, fmt.Sprintf("node timeout %v is not below the expiry %v", c.nodeTimeout, c.expiry))
	}
	if len(errs) == 0 && c.expiry-c.driftTerm() <= c.nodeTimeout {
		errs = append(errs, fmt.Sprintf("expiry %v leaves no validity after the drift allowance %v and the node timeout %v", c.expiry, c.driftTerm(), c.nodeTimeout))
	}
	if c.maxHold < 0 {
		errs = append(errs, fmt.Sprintf("maximum hold %v is negative", c.maxHold))
	}
	if c.minHold < 0 {
		errs = append(errs, fmt.Sprintf("minimum hold %v is negative", c.minHold))
	}
	if c.once.remember < 0 {
		errs = append(errs, fmt.Sprintf("WithRemember(%v) is negative", c.once.remember))
	} else if c.once.remember > 0 && c.once.remember < time.Millisecond {
		errs = append(errs, fmt.Sprintf("WithRemember(%v) is below Redis's 1ms resolution", c.once.remember))
	}
	if !c.outageSet {
		c.outage = c.expiry
	} else if c.outage < 0 {
		errs = append(errs, fmt.Sprintf("outage window %v is negative", c.outage))
	}
	return errs
}

// checkRest checks the options that are not durations, and returns what is
// wrong.
func (c *config) checkRest() (errs []string) {
	if c.loggerSet && c.logger == nil {
		errs = append(errs, "logger is nil (to log nothing, pass slog.New(slog.DiscardHandler))")
	}
	if c.replicas < 0 {
		errs = append(errs, fmt.Sprintf("sync replicas %d is negative", c.replicas))
	}
	if c.handoffs < 0 {
		errs = append(errs, fmt.Sprintf("local hand-off bound %d is negative", c.handoffs))
	}
	if strings.ContainsAny(c.prefix, "{}") {
		errs = append(errs, fmt.Sprintf("prefix %q contains '{' or '}', which would break the Redis Cluster hash tag", c.prefix))
	}
	if e := checkHolderInfo(c.holderInfo); e != "" {
		errs = append(errs, e)
	}
	if c.once.rememberSet && !c.once.forOnce {
		errs = append(errs, "WithRemember applies to a Once only: give it to NewOnce or Client.Once")
	}
	return errs
}

// checkHolderInfo returns what is wrong with s as a holder identity, "" if
// nothing is.
func checkHolderInfo(s string) string {
	if len(s) > MaxHolderInfo {
		return fmt.Sprintf("holder info is %d bytes, more than %d", len(s), MaxHolderInfo)
	}
	for i, r := range s {
		if r == utf8.RuneError && !strings.HasPrefix(s[i:], string(utf8.RuneError)) {
			return fmt.Sprintf("holder info %q is not valid UTF-8 (at byte %d)", s, i)
		}
		if !unicode.IsPrint(r) {
			return fmt.Sprintf("holder info %q has a character that is not printable, %U at byte %d", s, r, i)
		}
	}
	return ""
}

// driftTerm is what every validity loses to clock drift: a fraction of the
// expiry, plus 2ms for Redis's own expiry resolution.
func (c *config) driftTerm() time.Duration {
	return time.Duration(float64(c.expiry)*c.driftFactor) + 2*time.Millisecond
}
