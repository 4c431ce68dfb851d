package netlock

import (
	"context"
	"testing"
	"time"
)

// TestQuorumWaiterBehindStaleMinority: a holder's quorum holds the key on
// two of three nodes and the third has none (a release of the previous
// holder reached it late, after this holder's acquire found it busy
// there). Every round of a waiter then splits the votes: it is granted the
// free node, refused by the other two, and releases. It must not attempt
// every round trip for the whole hold: after a few quick retries it waits
// by message and the holder's TTL, and gets the lock as soon as the holder
// releases it.
func TestQuorumWaiterBehindStaleMinority(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			servers := startServers(t, 3)
			holder := quorumMutex(t, client, servers, "stale-minority")
			waiter := quorumMutex(t, client, servers, "stale-minority")
			mustLock(t, holder)
			if _, err := servers[2].Do("DEL", "netlock:{stale-minority}"); err != nil {
				t.Fatal(err)
			}

			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				done <- waiter.LockCtx(ctx)
			}()
			time.Sleep(200 * time.Millisecond) // the waiter's quick retries, over
			before := scriptCalls(t, servers[0])
			const window = time.Second
			time.Sleep(window) // a window in which the waiting is counted, not an ordering
			calls := scriptCalls(t, servers[0]) - before
			// The holder's watchdog extends about every 2.7 s (expiry 8 s);
			// a waiter that waits by message and TTL attempts at most
			// once in the window. Retrying every round trip, it made
			// hundreds.
			if calls > 4 {
				t.Errorf("node 0 ran %d scripts in %v while the waiter waited behind a holder with a stale minority: it polls", calls, window)
			}
			select {
			case err := <-done:
				t.Fatalf("LockCtx returned %v while the holder's quorum holds the lock", err)
			default:
			}

			start := time.Now()
			mustUnlock(t, holder)
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("LockCtx after the holder's release: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter did not get the lock within 5s of the holder's release")
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("the waiter got the lock %v after the holder's release; want it told by message", took)
			}
			mustUnlock(t, waiter)
		})
	}
}
