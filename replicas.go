package netlock

import (
	"context"
	"fmt"
	"time"
)

// A ReplicaWaiter is a Backend that can wait for its server's replicas to
// acknowledge a script's writes: what WithSyncReplicas needs. NewRedigo,
// NewRueidis and netlock/goredis implement it. A Backend that wraps another
// should implement it by forwarding, as it does Subscriber and
// ErrorClassifier, or New refuses it with WithSyncReplicas.
type ReplicaWaiter interface {
	Backend
	// EvalWait runs s as Eval does and then, on the same connection (so
	// that WAIT waits for the script's writes, not another client's),
	// WAIT replicas <timeout>, with the timeout of WaitTimeout(ctx). It
	// returns the script's reply and WAIT's count: how many replicas
	// acknowledged every write made on the connection so far. The count
	// is only read when the script reports a write, and may then be below
	// replicas. An error of the script or of WAIT is returned as err. It
	// returns ctx's error if ctx ends first.
	EvalWait(ctx context.Context, s *Script, keys, args []string, replicas int) (reply []int64, acked int, err error)
}

// waitMargin is what WaitTimeout leaves of a call's time for WAIT's reply
// to come back by the call's deadline: Redis applies WAIT's timeout at its
// next cron tick, up to 1000/hz ms after it passes (100ms at the default
// hz 10), and the call may first have to dial a connection (a client's
// pool of connections for blocking commands starts empty), and the reply
// takes a round trip and a scheduler's delay. A call with more time keeps
// a quarter of it (a loaded machine's delays grow with the time allowed);
// one with less than twice this left keeps half of it.
const waitMargin = 200 * time.Millisecond

// WaitTimeout returns the timeout an EvalWait bounded by ctx gives WAIT:
// what is left before ctx's deadline, less a margin (200ms or a quarter of
// what is left, whichever is more; half of it if less than 400ms is left) for Redis to notice the timeout
// (it does at its next cron tick, up to 100ms late at the default hz), for
// a connection to be dialed and for the reply to come back before the
// deadline. The result is whole milliseconds, WAIT's unit, and never below
// 1ms: WAIT 0 would block for ever. Without a deadline (netlock's calls
// always have one, the node timeout) it is DefaultNodeTimeout less the
// margin. It is exported for Backends of other client libraries, whose
// EvalWait gives WAIT this timeout.
func WaitTimeout(ctx context.Context) time.Duration {
	left := DefaultNodeTimeout
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	left -= min(left/2, max(waitMargin, left/4))
	return max(left.Truncate(time.Millisecond), time.Millisecond)
}

// replicaError reports that a node wrote a hold but too few of its replicas
// acknowledged it in time. It matches ErrNotReplicated.
type replicaError struct {
	acked, want int
	took        time.Duration
}

func (e *replicaError) Error() string {
	return fmt.Sprintf("not replicated: %d of %d replicas acknowledged the write within %v", e.acked, e.want, e.took)
}

func (e *replicaError) Unwrap() error { return ErrNotReplicated }
