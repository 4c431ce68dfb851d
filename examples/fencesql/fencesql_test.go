package fencesql_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	_ "modernc.org/sqlite"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/examples/fencesql"
)

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+t.Name()+"?mode=memory&cache=shared")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1) // one in-memory database for the whole test
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(fencesql.Schema); err != nil {
		t.Fatal(err)
	}
	return db
}

func backend(t *testing.T, mr *miniredis.Miniredis) netlock.Backend {
	t.Helper()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", mr.Addr()) }}
	t.Cleanup(func() { pool.Close() })
	return netlock.NewRedigo(pool)
}

func status(t *testing.T, db *sql.DB, id string) (string, int64) {
	t.Helper()
	var s string
	var token int64
	if err := db.QueryRow(`SELECT status, fence_token FROM invoices WHERE id = $1`, id).Scan(&s, &token); err != nil {
		t.Fatal(err)
	}
	return s, token
}

// TestStaleHolderRefusedBySQL: holder A takes the lock and pauses past its
// expiry; B takes the lock with a higher token and writes the row; A's late
// UPDATE, under A's token, changes no row, and B's write stays.
func TestStaleHolderRefusedBySQL(t *testing.T) {
	const expiry = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mr := miniredis.RunT(t)
	db := openDB(t)
	if _, err := db.Exec(`INSERT INTO invoices (id, status) VALUES ('42', 'open')`); err != nil {
		t.Fatal(err)
	}
	newMutex := func() *netlock.NetMutex {
		m, err := netlock.New("invoice-42", []netlock.Backend{backend(t, mr)},
			netlock.WithExpiry(expiry), netlock.WithAutoExtend(false),
			netlock.WithLogger(slog.New(slog.DiscardHandler))) // A's lost hold is expected
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, b := newMutex(), newMutex() // as in two processes

	if err := a.LockCtx(ctx); err != nil {
		t.Fatalf("A: LockCtx: %v", err)
	}
	if err := fencesql.SetStatus(ctx, db, "42", "A: draft", a.Token()); err != nil {
		t.Fatalf("A: SetStatus with its token %d: %v", a.Token(), err)
	}

	mr.FastForward(expiry) // A pauses; its key expires
	if err := b.LockCtx(ctx); err != nil {
		t.Fatalf("B: LockCtx after A's key expired: %v", err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("got B's token %d, want above A's %d", b.Token(), a.Token())
	}
	if err := fencesql.SetStatus(ctx, db, "42", "B: paid", b.Token()); err != nil {
		t.Fatalf("B: SetStatus with its token %d: %v", b.Token(), err)
	}

	// A wakes and writes, under the token of the hold it lost.
	err := fencesql.SetStatus(ctx, db, "42", "A: draft, again", a.Token())
	if !errors.Is(err, fencesql.ErrStale) {
		t.Fatalf("A: late SetStatus with token %d: got %v, want ErrStale", a.Token(), err)
	}
	if err := fencesql.Upsert(ctx, db, "42", "A: upsert", a.Token()); !errors.Is(err, fencesql.ErrStale) {
		t.Fatalf("A: late Upsert with token %d: got %v, want ErrStale", a.Token(), err)
	}
	if s, token := status(t, db, "42"); s != "B: paid" || token != int64(b.Token()) {
		t.Fatalf("row 42: got %q with token %d, want B's %q with %d", s, token, "B: paid", b.Token())
	}
	// The same token may write again (a retry whose reply was lost).
	if err := fencesql.SetStatus(ctx, db, "42", "B: paid, retried", b.Token()); err != nil {
		t.Fatalf("B: SetStatus again with its token: %v", err)
	}
	if err := a.UnlockCtx(ctx); !errors.Is(err, netlock.ErrLockLost) {
		t.Errorf("A: UnlockCtx: got %v, want ErrLockLost", err)
	}
	if err := b.UnlockCtx(ctx); err != nil {
		t.Errorf("B: UnlockCtx: %v", err)
	}
}

// TestUpsertMakesTheRow: an upsert makes a missing row, then follows the
// rule of SetStatus; SetStatus on a missing row is refused (nothing to
// fence against, nothing written).
func TestUpsertMakesTheRow(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	if err := fencesql.SetStatus(ctx, db, "7", "paid", 5); !errors.Is(err, fencesql.ErrStale) {
		t.Fatalf("SetStatus on a missing row: got %v, want ErrStale", err)
	}
	if err := fencesql.Upsert(ctx, db, "7", "draft", 5); err != nil {
		t.Fatalf("Upsert of a missing row: %v", err)
	}
	if err := fencesql.Upsert(ctx, db, "7", "stale", 4); !errors.Is(err, fencesql.ErrStale) {
		t.Fatalf("Upsert with a lower token: got %v, want ErrStale", err)
	}
	if err := fencesql.Upsert(ctx, db, "7", "paid", 6); err != nil {
		t.Fatalf("Upsert with a higher token: %v", err)
	}
	if s, token := status(t, db, "7"); s != "paid" || token != 6 {
		t.Fatalf("row 7: got %q with token %d, want %q with 6", s, token, "paid")
	}
}

// TestBadToken: 0 and a token beyond SQL's INTEGER are refused with an
// error that names them, before the database is asked.
func TestBadToken(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	for _, tt := range []struct {
		token uint64
		want  string
	}{
		{0, "token 0"},
		{math.MaxInt64 + 1, "token 9223372036854775808 is above"},
	} {
		for name, write := range map[string]func() error{
			"SetStatus": func() error { return fencesql.SetStatus(ctx, db, "1", "x", tt.token) },
			"Upsert":    func() error { return fencesql.Upsert(ctx, db, "1", "x", tt.token) },
		} {
			err := write()
			if err == nil || !strings.Contains(err.Error(), tt.want) || errors.Is(err, fencesql.ErrStale) {
				t.Errorf("%s with token %d: got %v, want an error naming %q", name, tt.token, err, tt.want)
			}
		}
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM invoices`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after refused writes: %d (%v), want 0", n, err)
	}
}
