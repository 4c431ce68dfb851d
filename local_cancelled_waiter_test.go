package netlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// rueidislock's "missing peers" scenario (TestLocker_WithContext_MissingPeers)
// against one NetMutex shared by many goroutines: in each round the lock is
// held, missingPeersWaiters goroutines call LockCtx with one ctx, that ctx
// is cancelled, and then the holder unlocks. Unlock hands the hold to the
// first waiter still in line, whose ctx has ended: it must pass the hold on
// (to the next waiter, or release it), never return nil.
const (
	missingPeersRounds  = 100
	missingPeersWaiters = 100
)

// A LockCtx whose ctx was cancelled before the lock was free never returns
// nil, whether the hold would come by local hand-off or from Redis; and the
// cancelled waiters pass on whatever reaches them, so nothing is stranded:
// the lock is free in Redis and in this process after every round.
func TestCancelledWaiterNeverHolds(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		m := e.newMutex(t, "missing")
		var held []string // the waiters that got nil, by round
		handoffs := 0     // of them, how many got the previous holder's token
		start := time.Now()
		for round := range missingPeersRounds {
			for _, tok := range missingPeersRound(t, e, m, missingPeersWaiters) {
				if tok.got == tok.prev {
					handoffs++
				}
				held = append(held, fmt.Sprintf("round %d: token %d (previous holder's %d)", round, tok.got, tok.prev))
			}
			if t.Failed() {
				break
			}
		}
		// Nothing is left owned in this process either.
		if ok, err := m.TryLockCtx(context.Background()); !ok || err != nil {
			t.Fatalf("TryLockCtx after the last round: got (%v, %v), want (true, nil)", ok, err)
		}
		mustUnlock(t, m)
		if len(held) > 0 {
			t.Errorf("LockCtx with a ctx cancelled before the unlock: got nil %d times (%d by local hand-off), want an error every time; first: %s",
				len(held), handoffs, strings.Join(held[:min(len(held), 5)], "; "))
		}
		t.Logf("%d rounds of %d waiters in %v", missingPeersRounds, missingPeersWaiters, time.Since(start).Round(time.Millisecond))
	})
}

// heldToken is the token a waiter got with a nil LockCtx, and the token of
// the hold the round's holder had.
type heldToken struct{ got, prev uint64 }

// missingPeersRound runs one round of TestCancelledWaiterNeverHolds on m and
// returns the tokens of the waiters whose LockCtx returned nil: each unlocks
// at once, as every goroutine that gets the lock must.
//
// The race this is about needs a waiter for which its turn and ctx's end are
// both ready when it starts to wait; left to the scheduler that is rare (a
// waiter must be between queueing and its select as ctx ends and the hold
// reaches it). So half the waiters are held right there: each waits with a
// windowCtx, whose first Done (asked for by the select that waits for the
// turn) blocks until ctx has been cancelled and the holder has unlocked. The
// first of them is first in line, so the unlock hands the hold to it. The
// other half arrive while ctx ends and the hold is passed on, as in
// rueidislock's test.
func missingPeersRound(t *testing.T, e *env, m *NetMutex, waiters int) []heldToken {
	t.Helper()
	mustLock(t, m)
	prev := m.Token()
	ctx, cancel := context.WithCancel(context.Background())
	arrived := make(chan struct{}, waiters)
	goOn := make(chan struct{})
	var (
		mu   sync.Mutex
		held []heldToken
		wg   sync.WaitGroup
	)
	for i := range waiters {
		wctx := &windowCtx{Context: ctx, arrived: arrived, goOn: goOn}
		wg.Go(func() {
			err := m.LockCtx(wctx)
			if err == nil {
				// ctx was cancelled before the unlock that freed m:
				// this hold must not exist. Token is this hold's: m is
				// held by this goroutine until its Unlock.
				mu.Lock()
				held = append(held, heldToken{got: m.Token(), prev: prev})
				mu.Unlock()
				if err := m.UnlockCtx(context.Background()); err != nil {
					t.Errorf("waiter %d: UnlockCtx after a nil LockCtx: %v", i, err)
				}
				return
			}
			if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
				t.Errorf("waiter %d: LockCtx: got %v, want an error matching ErrNotObtained and context.Canceled", i, err)
			}
		})
	}
	// Every waiter that comes before ctx ends asks for Done before it
	// blocks, whatever the waiting code looks like; the bound only keeps
	// the round going if one does not.
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
wait:
	for range waiters / 2 {
		select {
		case <-arrived:
		case <-timer.C:
			t.Log("half the waiters did not ask for ctx.Done within 10s; going on")
			break wait
		}
	}
	cancel()
	mustUnlock(t, m)
	close(goOn)
	redistest.Within(t, 10*time.Second, "the round's waiters", wg.Wait)

	// Whatever reached a cancelled waiter was passed on: the last of them
	// released the lock (and the next round's Lock finds m not owned here).
	if e.exists(t, m.keys.lock) {
		t.Errorf("lock key %s after the round: got present, want absent (stranded by a cancelled waiter)", m.keys.lock)
	}
	return held
}
