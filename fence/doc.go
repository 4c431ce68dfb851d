// Package fence provides fenced writes: a resource that keeps the highest
// fencing token it has seen and refuses a write that carries a lower one.
//
// # Fencing at the resource
//
// A lock does not, by itself, stop a holder that has lost it from writing.
// A process can pause (a GC pause, a stalled VM, a slow network) past its
// hold's expiry; another takes the lock and writes; the first wakes and
// writes too, still believing it holds the lock. Martin Kleppmann's answer
// ("How to do distributed locking", 2016) is a fencing token: every
// acquisition of the lock gets a number higher than the one before
// (NetMutex.Token), the writer sends it with each write, and the resource
// itself refuses a write whose token is below the highest it has seen.
// The check is at the resource, so no pause of the writer can get around
// it.
//
// # Data kept in Redis
//
// Set and Delete are that check for data kept in Redis: one Lua script
// each, which compares the writer's token with the one recorded for the
// key and writes only if it is not lower:
//
//	m.Lock()
//	defer m.Unlock()
//	err := fence.Set(ctx, data, "invoice:42", "paid", m.Token())
//	if errors.Is(err, fence.ErrStale) {
//		// a later holder has written: this one lost the lock
//	}
//
// A fenced key is a Redis hash of two fields, the value (ValueField) and
// the highest token written (TokenField), so the record costs one field
// per key, however many writes it sees. Read it with any client: HGET key v.
// A fenced delete keeps the token, with no expiry, so that a late writer
// is refused after it too.
//
// # SQL
//
// A table row is fenced the same way, with a column that keeps the token
// and a condition on it in the statement that writes:
//
//	UPDATE invoices SET status = $2, fence_token = $3
//	WHERE id = $1 AND fence_token <= $3
//
// No row updated means the token is stale (or the row is gone): the writer
// lost the lock and must not retry. An INSERT of a row that must not exist
// yet needs no token; a DELETE takes the same condition, or becomes an
// UPDATE that marks the row deleted, so that the token stays.
//
// # HTTP
//
// A service that another process writes to through an API can check the
// token the same way: the client sends it in a header, say
//
//	Fence-Token: 1234
//
// and the service keeps the highest token it has accepted per resource,
// refusing a lower one (409 Conflict) before doing any work, in the same
// transaction or script as the write itself.
//
// # Limits
//
// Tokens are compared per key: the writers of a key must take their tokens
// from one lock name (one fence counter). A token is checked when the write
// reaches Redis; a write whose reply was lost may have been made, and can
// be retried with the same token.
package fence
