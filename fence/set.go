package fence

import (
	"context"

	"github.com/netlock-go/netlock"
)

// Set writes value to key on b, only if token is at least the highest token
// recorded for key, and records token: a fenced write. The same token may
// write again, so a retry of a Set whose reply was lost is safe. If a higher
// token is recorded, Set returns an error matching ErrStale and changes
// nothing. The check and the write are one Lua script: no other client's
// write comes between them.
//
// token is the writer's fencing token, such as the NetMutex.Token of the
// hold it writes under; 0 is refused. value may be any bytes. key becomes a
// Redis hash (see ValueField); a key of another kind is refused with an
// error matching ErrNotFenced. b is the Redis that keeps the data: it need
// not be one of the lock's Backends.
//
// Set blocks for one round trip to b, until the reply or until ctx ends.
// When b's call fails (ctx ended, a timeout, a connection lost), the write
// may or may not have been made; the error wraps b's error.
func Set(ctx context.Context, b netlock.Backend, key, value string, token uint64) error {
	return run(ctx, "set", setScript, b, key, token, value)
}
