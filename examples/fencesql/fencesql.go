package fencesql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
)

// checkToken refuses a token a fenced write refuses before asking the
// database: 0 (what Token returns when the mutex is not locked, or fencing
// is off) or one above an SQL INTEGER's range.
func checkToken(token uint64) error {
	switch {
	case token == 0:
		return errors.New("fencesql: token 0: the mutex is not locked, or fencing is off")
	case token > math.MaxInt64:
		return fmt.Errorf("fencesql: token %d is above an SQL INTEGER's range", token)
	}
	return nil
}

// ErrStale is returned by SetStatus when the row was written with a higher
// token than the one given: a later holder of the lock owns it.
var ErrStale = errors.New("fencesql: stale fencing token")

// Schema creates the invoices table: fence_token keeps the highest token
// written to each row.
const Schema = `CREATE TABLE invoices (
	id          TEXT PRIMARY KEY,
	status      TEXT NOT NULL,
	fence_token INTEGER NOT NULL DEFAULT 0
)`

// SetStatus writes status to invoice id only if token is at least the
// highest token the row was written with, and records token; the check and
// the write are one statement. It returns an error matching ErrStale, and
// changes nothing, when a later holder has written the row (or the row does
// not exist).
func SetStatus(ctx context.Context, db *sql.DB, id, status string, token uint64) error {
	if err := checkToken(token); err != nil {
		return err
	}
	res, err := db.ExecContext(ctx,
		`UPDATE invoices SET status = $1, fence_token = $2
		 WHERE id = $3 AND fence_token <= $2`,
		status, int64(token), id)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("invoice %s: token %d: %w", id, token, ErrStale)
	}
	return nil
}

// Upsert writes status to invoice id, making the row if it does not exist,
// under the same rule as SetStatus.
func Upsert(ctx context.Context, db *sql.DB, id, status string, token uint64) error {
	if err := checkToken(token); err != nil {
		return err
	}
	res, err := db.ExecContext(ctx,
		`INSERT INTO invoices (id, status, fence_token) VALUES ($1, $2, $3)
		 ON CONFLICT (id) DO UPDATE SET status = excluded.status, fence_token = excluded.fence_token
		 WHERE invoices.fence_token <= excluded.fence_token`,
		id, status, int64(token))
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("invoice %s: token %d: %w", id, token, ErrStale)
	}
	return nil
}
