package otelnetlock

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/netlock-go/netlock"
)

// errorType follows the package documentation's table, first match first.
func TestErrorType(t *testing.T) {
	quorum := fmt.Errorf("netlock: node 0: %w", netlock.ErrQuorum)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{quorum, "quorum"},
		// A wait that ended while Redis did not answer: quorum, not the deadline.
		{errors.Join(netlock.ErrNotObtained, context.DeadlineExceeded, quorum), "quorum"},
		{netlock.ErrLockLost, "lock_lost"},
		{netlock.ErrNotHeld, "not_held"},
		{errors.Join(netlock.ErrNotObtained, context.DeadlineExceeded), "deadline_exceeded"},
		{errors.Join(netlock.ErrNotObtained, context.Canceled), "canceled"},
		{context.Canceled, "canceled"}, // an ExtendCtx whose ctx was cancelled
		{errors.Join(netlock.ErrNotObtained, errors.New("shutting down")), "not_obtained"},
		{errors.New("netlock: node 0: WRONGTYPE"), "_OTHER"},
	} {
		if got := errorType(tc.err); got != tc.want {
			t.Errorf("errorType(%q): got %q, want %q", tc.err, got, tc.want)
		}
	}
}

// A call's outcome: acquired, busy (no error, not acquired) or error.
func TestAcquireOutcome(t *testing.T) {
	for _, tc := range []struct {
		done             netlock.AcquireDone
		outcome, errType string
	}{
		{netlock.AcquireDone{Acquired: true}, "acquired", ""},
		{netlock.AcquireDone{Try: true, Contended: true}, "busy", ""},
		{netlock.AcquireDone{Err: errors.Join(netlock.ErrNotObtained, context.Canceled)}, "error", "canceled"},
	} {
		outcome, errType := acquireOutcome(tc.done)
		if outcome != tc.outcome || errType != tc.errType {
			t.Errorf("acquireOutcome(%+v): got %q, %q; want %q, %q", tc.done, outcome, errType, tc.outcome, tc.errType)
		}
	}
}
