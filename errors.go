package netlock

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error a NetMutex method returns wraps one of these
// (or a context error), so callers test them with errors.Is; the exceptions
// are misuse found before any work: New's validation errors and the use of a
// NetMutex not made by New or Client.Mutex, which say what is wrong in their
// message.
var (
	// ErrNotObtained means the lock was held by another when the call
	// stopped: at once (TryLock, TryLockCtx), or when the caller's context
	// ended while waiting (LockCtx, Do); the error then also matches the
	// context's error. A wait that ended while Redis could not be asked
	// (too few nodes answered its last attempt) matches ErrQuorum and the
	// context's error instead.
	ErrNotObtained = errors.New("netlock: not obtained")

	// ErrNotHeld means Unlock, UnlockCtx or ExtendCtx was called on a NetMutex
	// that is not locked.
	ErrNotHeld = errors.New("netlock: not held")

	// ErrLockLost means the hold ended without Unlock: it expired, was
	// deleted, or was taken by another client, as seen by a failed extend or
	// release, or by the local deadline passing without a successful extend.
	ErrLockLost = errors.New("netlock: lock lost")

	// ErrQuorum means too few nodes answered (errors, timeouts, refused
	// connections) for the operation to succeed. The error also carries each
	// failed node's error, prefixed with the node's index.
	ErrQuorum = errors.New("netlock: quorum not reached")

	// ErrNotReplicated means a node took the lock, but fewer of its
	// replicas than WithSyncReplicas asks for acknowledged it in time: a
	// failover could have lost it. The acquire was undone on that node, and
	// the error, naming the node and the count, is reported at once rather
	// than ridden out. It also matches ErrQuorum.
	ErrNotReplicated = errors.New("netlock: not replicated")

	// ErrNoLeader means that nobody leads an Election: no campaigner has
	// been elected, or the last leader resigned or lost its leadership.
	ErrNoLeader = errors.New("netlock: no leader")

	// ErrNotLeader means Proclaim or Resign was called on an Election that
	// does not lead.
	ErrNotLeader = errors.New("netlock: not the leader")
)

// errUnlockUnlocked is the panic value of Unlock on an unlocked NetMutex, in
// the words sync.Mutex uses.
var errUnlockUnlocked = &wrapError{msg: "netlock: unlock of unlocked mutex", err: ErrNotHeld}

// wrapError is an error with its own message that still matches a sentinel.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }

// notObtained returns the error for a context that ended while acquiring
// a lock held by another: both errors.Is(err, ErrNotObtained) and
// errors.Is(err, cause) hold.
func notObtained(cause error) error {
	return join(ErrNotObtained, cause)
}

// unreachable returns the error for a context that ended while acquiring
// with Redis not answering (down, an error matching ErrQuorum): it matches
// cause and down, not ErrNotObtained.
func unreachable(cause, down error) error {
	return join(cause, down)
}

// join is errors.Join with the messages on one line, joined with "; ", so
// that a log line or an HTTP body is not split. It returns nil if every
// error is nil.
func join(errs ...error) error {
	e := &joinError{errs: make([]error, 0, len(errs))}
	for _, err := range errs {
		if err != nil {
			e.errs = append(e.errs, err)
		}
	}
	if len(e.errs) == 0 {
		return nil
	}
	return e
}

type joinError struct{ errs []error }

func (e *joinError) Error() string {
	var b strings.Builder
	for i, err := range e.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e *joinError) Unwrap() []error { return e.errs }

// nodeError names the node an error came from.
func nodeError(i int, err error) error {
	if strings.Contains(err.Error(), "WRONGTYPE") {
		return fmt.Errorf("netlock: node %d: a key of this lock holds a value of another type, nothing was changed: %w", i, err)
	}
	return fmt.Errorf("netlock: node %d: %w", i, err)
}

// quorumError reports that too few nodes answered. It matches ErrQuorum and
// each node's error.
type quorumError struct {
	nodes, answered, need int
	errs                  []error // one per failed node, already named by nodeError
}

func (e *quorumError) Error() string {
	var b strings.Builder
	if e.nodes == 1 {
		b.WriteString(e.errs[0].Error())
		return b.String()
	}
	fmt.Fprintf(&b, "netlock: quorum not reached: %d of %d nodes answered, %d needed", e.answered, e.nodes, e.need)
	for _, err := range e.errs {
		b.WriteString("; ")
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e *quorumError) Unwrap() []error {
	return append([]error{ErrQuorum}, e.errs...)
}
