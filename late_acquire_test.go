package netlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// lateBackend is newBackend, except that the rueidis client keeps a single
// pipelining connection (rueidis's default for one server is four, each
// dialled on first use, picked at random per command). With several, the
// acquire below may be the first command on a connection not yet dialled:
// its handshake is then delayed, the acquire is never sent at all, and the
// test would not exercise a late acquire.
func lateBackend(t *testing.T, client, addr string) Backend {
	t.Helper()
	if client != "rueidis" {
		return newBackend(t, client, addr)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{addr},
		DisableCache:      true,
		PipelineMultiplex: -1, // 2^0 = one connection
	})
	if err != nil {
		t.Fatalf("rueidis.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(c.Close)
	return NewRueidis(c)
}

// lateNeverHeld fails the test if the lock key for name exists on any of
// servers at any check during d.
func lateNeverHeld(t *testing.T, servers []*redistest.Server, name string, d time.Duration) {
	t.Helper()
	// Looked at every 20ms: a check over a period, not an ordering.
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if n := holders(t, servers, name); n != 0 {
			t.Fatalf("lock key %q appeared on %d servers after the caller gave up: a late acquire took it", name, n)
		}
	}
}

// The network delays an acquire past the node timeout, and the cleanup
// release, sent on another connection, reaches the server first. The
// release finds nothing to delete; the acquire, arriving afterwards, must not
// take the key (the release's tombstone refuses it), or the key would be
// stranded until its TTL with nobody holding the lock.
//
// The proxy delays only the acquire: the delay is lifted a few milliseconds
// after LockCtx starts, when the acquire has been read by the proxy and well
// before the node timeout, so the release is not delayed. Each client then
// sends the release on a connection other than the acquire's, and it reaches
// the server first (the test checks that it did):
//
//   - redigo: the read times out, the pool closes the broken connection, and
//     the release goes on a freshly dialled one.
//   - rueidis (one pipelining connection, see lateBackend): a lone command
//     with a deadline on an idle connection is sent synchronously with a
//     socket deadline (pipe.syncDo, rueidis v1.0.79); the timeout fails the
//     pipe and closes the connection, so the release goes on a new one too.
//     (Had the release been queued behind the acquire on the same
//     connection, the server would run them in the benign order: the acquire
//     takes the key and the release deletes it.)
//   - go-redis (netlock/goredis, registered by goredis_client_test.go, with
//     ContextTimeoutEnabled): the node timeout is the read's deadline; the
//     timeout marks the connection bad, the pool closes it, and the release
//     goes on another.
//
// The proxy still delivers the acquire when due, after the client closed its
// connection, as a network would.
func TestLateAcquireAfterRelease(t *testing.T) {
	const delay = 600 * time.Millisecond
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			server := redistest.Start(t)
			proxy := redistest.StartProxy(t, server.Addr())
			// No outage window: the test is about one round and its release.
			m, err := New("late", []Backend{lateBackend(t, client, proxy.Addr())}, WithNodeTimeout(100*time.Millisecond), WithOutageWindow(0))
			if err != nil {
				t.Fatal(err)
			}
			servers := []*redistest.Server{server}

			// Warm up: connections exist and the scripts are loaded, so the
			// acquire below is one EVALSHA on an existing connection.
			mustLock(t, m)
			mustUnlock(t, m)
			before := scriptCalls(t, server)

			proxy.SetDelay(delay)
			lifted := make(chan struct{})
			go func() {
				defer close(lifted)
				// Within the node timeout, so the release is not delayed:
				// by then the proxy has read the acquire (it does not say
				// when it has, so this is a window, not an observed event).
				time.Sleep(30 * time.Millisecond)
				proxy.SetDelay(0)
			}()
			start := time.Now()
			redistest.Within(t, 5*time.Second, "LockCtx", func() { err = m.LockCtx(context.Background()) })
			<-lifted
			if !errors.Is(err, ErrQuorum) {
				t.Fatalf("LockCtx with the acquire delayed past the node timeout: got %v, want ErrQuorum", err)
			}
			if elapsed := time.Since(start); elapsed >= delay {
				t.Fatalf("LockCtx took %v, not less than the delay %v: the test cannot tell the orders apart", elapsed, delay)
			}

			// The release has run and the acquire is still on its way: the
			// bad order, which the test is about.
			if ran := scriptCalls(t, server) - before; ran != 1 {
				t.Fatalf("%d scripts ran by the time LockCtx returned, want 1: the release, ahead of the delayed acquire", ran)
			}
			if h := holders(t, servers, "late"); h != 0 {
				t.Fatal("lock key exists right after LockCtx failed")
			}

			// Past the delay the acquire reaches the server; it must not
			// leave the key.
			eventually(t, 5*time.Second, "the delayed acquire run by the server", func() bool { return scriptCalls(t, server)-before >= 2 })
			lateNeverHeld(t, servers, "late", time.Second)
			if ran := scriptCalls(t, server) - before; ran != 2 {
				t.Fatalf("%d scripts ran after the delay, want 2 (acquire and release): the delayed acquire never arrived", ran)
			}

			mustLock(t, m) // and the lock works again
			mustUnlock(t, m)
		})
	}
}
