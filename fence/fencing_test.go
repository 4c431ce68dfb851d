package fence_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/fence"
)

// TestStaleHolderRefused is the story fencing is for: holder A takes the
// lock and pauses (it does not extend) past its expiry; B takes the lock
// with a higher token and writes; A's late write, under A's token, is
// refused and B's value stays.
func TestStaleHolderRefused(t *testing.T) {
	const expiry = 300 * time.Millisecond
	forEachServer(t, func(t *testing.T, s server) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		newMutex := func() *netlock.NetMutex {
			m, err := netlock.New("invoice-42", []netlock.Backend{s.backend(t)},
				netlock.WithExpiry(expiry), netlock.WithAutoExtend(false),
				netlock.WithLogger(slog.New(slog.DiscardHandler))) // A's lost hold is expected
			if err != nil {
				t.Fatalf("netlock.New: %v", err)
			}
			return m
		}
		a, b := newMutex(), newMutex() // as in two processes
		data := s.backend(t)           // the Redis that keeps the data

		if err := a.LockCtx(ctx); err != nil {
			t.Fatalf("A: LockCtx: %v", err)
		}
		tokenA := a.Token()
		if err := fence.Set(ctx, data, "invoice:42", "A: draft", tokenA); err != nil {
			t.Fatalf("A: Set with its token %d: %v", tokenA, err)
		}

		// A pauses. Its key expires: at once on miniredis, whose time is
		// moved; on a real server, B's LockCtx waits for it.
		if s.mini != nil {
			s.mini.FastForward(expiry)
		}
		if err := b.LockCtx(ctx); err != nil {
			t.Fatalf("B: LockCtx after A's key expired: %v", err)
		}
		tokenB := b.Token()
		if tokenB <= tokenA {
			t.Fatalf("got B's token %d, want above A's %d", tokenB, tokenA)
		}
		if err := fence.Set(ctx, data, "invoice:42", "B: paid", tokenB); err != nil {
			t.Fatalf("B: Set with its token %d: %v", tokenB, err)
		}

		// A wakes and writes, under the token of the hold it lost.
		if got := a.Token(); got != tokenA {
			t.Fatalf("got A's token %d after its key expired, want %d until Unlock", got, tokenA)
		}
		if err := fence.Set(ctx, data, "invoice:42", "A: draft, again", a.Token()); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("A: late Set with token %d: got %v, want ErrStale", tokenA, err)
		}
		if err := fence.Delete(ctx, data, "invoice:42", a.Token()); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("A: late Delete with token %d: got %v, want ErrStale", tokenA, err)
		}
		if value, _, _ := s.fenced(t, "invoice:42"); value != "B: paid" {
			t.Fatalf("got %q, want B's value %q", value, "B: paid")
		}

		if err := a.UnlockCtx(ctx); !errors.Is(err, netlock.ErrLockLost) {
			t.Errorf("A: UnlockCtx: got %v, want ErrLockLost", err)
		}
		if err := b.UnlockCtx(ctx); err != nil {
			t.Errorf("B: UnlockCtx: %v", err)
		}
	})
}
