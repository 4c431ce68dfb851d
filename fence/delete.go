package fence

import (
	"context"

	"github.com/netlock-go/netlock"
)

// Delete removes key's value on b, only if token is at least the highest
// token recorded for key, and records token: a fenced delete. If a higher
// token is recorded, Delete returns an error matching ErrStale and changes
// nothing; a key of another kind than a fenced value is refused with an
// error matching ErrNotFenced. Deleting a key that has no value records
// token all the same.
//
// The token stays, as the key's only field, so that a writer with a lower
// token is refused after the delete too: it is kept with no expiry, since
// a late writer can be any amount late. A key that had a TTL keeps it. To
// reclaim the record, expire or delete the key (EXPIRE, UNLINK) once no
// writer holding a token of it can still be running.
//
// Delete blocks for one round trip to b, until the reply or until ctx ends.
// When b's call fails, the delete may or may not have been made; the error
// wraps b's error.
func Delete(ctx context.Context, b netlock.Backend, key string, token uint64) error {
	return run(ctx, "delete", deleteScript, b, key, token)
}
