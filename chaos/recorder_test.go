package chaos

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/netlock-go/netlock"
)

// A holdPath is how a hold came.
type holdPath int

const (
	byRound    holdPath = iota // an acquire round took the free lock
	byAdoption                 // an acquire round found a grant a release made us, and adopted it
	byMessage                  // a release granted it, and its message said so: no round trip
)

func (p holdPath) String() string {
	return [...]string{"round", "adoption", "message"}[p]
}

// A recorder watches, from outside the library, what one NetMutex asks of
// Redis: a Backend wrapper on each of its nodes (wrap) sees every script
// call, and an Observer (observer) sees its extend rounds. From them it
// tells how each hold came and where the hold's local deadline (its until)
// lies: the start of the round that made or extended the hold
// plus its validity, expiry − elapsed − (expiry·drift + 2ms). A round
// starts before its calls do and ends after they return, so the deadline a
// recorder computes for a hold that came by a round is never before the
// library's; it is later by the scheduling of the round's goroutines, a few
// microseconds. A hold granted by a release counts from the start of the
// waiter's first round that joined the queue (lua/acquire.lua, flag j), and
// an extend from its start (ExtendDone: now − Took).
//
// It decodes the scripts' arguments and replies as lua/*.lua document
// them: what any Backend sees.
type recorder struct {
	nodes             int
	expiry, driftTerm time.Duration

	mu      sync.Mutex
	rounds  map[string]*round    // acquire rounds, by their value (ARGV[1], fresh every round)
	byToken map[uint64]*round    // the round in which a node granted each token
	joins   map[string]time.Time // start of the first call that joined the queue under each nonce
	nonce   string               // the nonce of the latest acquire call that carried one
	holds   map[uint64]holdTiming
	// granted counts the releases and leaves that granted the lock to a
	// waiter (see lua/handon.lua); not those whose reply a fault lost.
	granted int
	skipped int // queued waiters they skipped, nobody listening for them
	// refusals counts the error replies of the scripts' calls by their
	// code (LOADING, READONLY, ...), to show which refusals the faults
	// made the clients meet.
	refusals map[string]int
}

// A round is one acquire round as its calls show it.
type round struct {
	first, last time.Time // the earliest call's start, the latest call's end
	adopted     bool      // a node's reply: a release had granted us the lock
}

// holdTiming is what a recorder knows of one hold.
type holdTiming struct {
	path  holdPath
	until time.Time // the local deadline the acquire gave it
	ext   time.Time // the latest deadline an extend gave it; zero if none
}

// newRecorder returns a recorder for a NetMutex on nodes Backends with
// expiry and drift factor drift.
func newRecorder(nodes int, expiry time.Duration, drift float64) *recorder {
	return &recorder{
		nodes:     nodes,
		expiry:    expiry,
		driftTerm: time.Duration(float64(expiry)*drift) + 2*time.Millisecond,
		rounds:    map[string]*round{},
		byToken:   map[uint64]*round{},
		joins:     map[string]time.Time{},
		holds:     map[uint64]holdTiming{},
		refusals:  map[string]int{},
	}
}

// wrap returns b, watched by r.
func (r *recorder) wrap(b netlock.Backend) netlock.Backend { return &spyBackend{Backend: b, r: r} }

// observer returns the Observer to give the NetMutex with WithObserver.
func (r *recorder) observer() netlock.Observer { return netlock.Observer{Extend: r.extended} }

// acquired records the hold with token that LockCtx has just returned, and
// reports how it came; false if no call the recorder saw explains it.
func (r *recorder) acquired(token uint64) (holdPath, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var h holdTiming
	switch rd, joined := r.byToken[token], r.joins[r.nonce]; {
	case rd != nil:
		h.path = byRound
		if rd.adopted {
			h.path = byAdoption
		}
		h.until = rd.first.Add(r.expiry - rd.last.Sub(rd.first) - r.driftTerm)
	case r.nodes == 1 && !joined.IsZero():
		// No reply granted it: the message of a release did, to the
		// waiter's current join (a grant for an earlier one is refused).
		h.path = byMessage
		h.until = joined.Add(r.expiry - r.driftTerm)
	default:
		return 0, false
	}
	r.holds[token] = h
	// The calls of this LockCtx are no longer needed: the next one makes
	// rounds of its own, with values and a nonce of its own.
	clear(r.rounds)
	clear(r.byToken)
	clear(r.joins)
	r.nonce = ""
	return h.path, true
}

// until returns the local deadline of the hold with token, as its acquire
// and its successful extends so far set it.
func (r *recorder) until(token uint64) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.holds[token]
	if h.ext.After(h.until) {
		return h.ext
	}
	return h.until
}

// extended is the Observer's Extend: a successful round moves the hold's
// deadline to the round's start plus its validity.
func (r *recorder) extended(_ context.Context, d netlock.ExtendDone) {
	if d.Err != nil {
		return
	}
	start := time.Now().Add(-d.Took)
	until := start.Add(r.expiry - d.Took - r.driftTerm)
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.holds[d.Token]; ok && until.After(h.ext) {
		h.ext = until
		r.holds[d.Token] = h
	}
}

// figures returns what the releases and leaves the recorder saw
// reported, and the error replies it saw by code, added to refusals.
func (r *recorder) figures(refusals map[string]int) (granted, skipped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for code, n := range r.refusals {
		refusals[code] += n
	}
	return r.granted, r.skipped
}

// replyCode returns the code of err if it is one of the error replies by
// which Redis refuses a call (refusalCodes), or "".
func replyCode(err error) string {
	if err == nil {
		return ""
	}
	code, _, _ := strings.Cut(err.Error(), " ")
	if !slices.Contains(refusalCodes, code) {
		return ""
	}
	return code
}

// refusalCodes are the codes of the error replies by which Redis refuses
// a call: for a while, for want of a right, or for want of
// the script (SCRIPT FLUSH; a Backend sends the script again itself, so
// that it is seen only if one does not).
var refusalCodes = []string{"LOADING", "READONLY", "MISCONF", "BUSY", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN", "OOM", "NOPERM", "NOSCRIPT"}

// spyBackend is one client's Backend on one node as its recorder sees it:
// it forwards everything, pub/sub and the telling of final errors included,
// so that the client behaves as on the Backend itself.
type spyBackend struct {
	netlock.Backend
	r *recorder
}

func (b *spyBackend) Eval(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	start := time.Now()
	vals, err := b.Backend.Eval(ctx, s, keys, args)
	end := time.Now()
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if code := replyCode(err); code != "" {
		r.refusals[code]++
	}
	switch s.Name() {
	case "acquire":
		// ARGV: value, expiry, "<proposal>:<member>:<flags>:<queue ttl>:<holder>"
		// (":<holder>" for an uncontended attempt), the member
		// "<waiter id>+<expiry>+<nonce>+<holder>" when a release may grant
		// the lock.
		if len(args) < 3 {
			break
		}
		rd := r.rounds[args[0]]
		if rd == nil {
			rd = &round{first: start}
			r.rounds[args[0]] = rd
		}
		if start.Before(rd.first) {
			rd.first = start
		}
		if end.After(rd.last) {
			rd.last = end
		}
		if f := strings.Split(args[2], ":"); len(f) == 5 {
			if m := strings.Split(f[1], "+"); len(m) == 4 {
				r.nonce = m[2]
				if _, seen := r.joins[m[2]]; !seen && strings.Contains(f[2], "j") {
					r.joins[m[2]] = start
				}
			}
		}
		// Reply {1, token, n}: acquired (n > 0: adopted a grant).
		if err == nil && len(vals) >= 3 && vals[0] == 1 {
			r.byToken[uint64(vals[1])] = rd
			rd.adopted = rd.adopted || vals[2] > 0
		}
	case "release", "leave":
		// Reply {status, heard, granted, skipped}.
		if err == nil && len(vals) == 4 {
			r.granted += int(vals[2])
			r.skipped += int(vals[3])
		}
	}
	return vals, err
}

// Hub and Final forward the optional interfaces of the wrapped Backend, as
// package netlock asks of a wrapper (see Subscriber).
func (b *spyBackend) Hub() *netlock.Hub {
	if s, ok := b.Backend.(netlock.Subscriber); ok {
		return s.Hub()
	}
	return nil
}

func (b *spyBackend) Final(err error) bool {
	f, ok := b.Backend.(netlock.ErrorClassifier)
	return ok && f.Final(err)
}
