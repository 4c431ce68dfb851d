package chaos

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/chaos/internal/toxi"
	"github.com/netlock-go/netlock/internal/redistest"
)

// hostileRow is one hostile network and what must
// happen, checked on a real redis-server reached through a toxiproxy, with
// one client library. The other rows, which need no proxy, are the
// library's TestBadInput.
type hostileRow struct {
	name string
	run  func(t *testing.T, client string)
}

// TestBadInput runs, with each client library, the rows of the library's
// TestBadInput that need a network that misbehaves: a server slower than
// the node timeout, a context cancelled while the acquire is on its way,
// and a server whose replies are cut off. Every failure must be a clear
// error naming the node, matching the documented sentinels, never a hang,
// never a key left behind.
func TestBadInput(t *testing.T) {
	for _, client := range clients {
		t.Run(client, func(t *testing.T) {
			for _, row := range hostileRows {
				t.Run(row.name, func(t *testing.T) { row.run(t, client) })
			}
		})
	}
}

var hostileRows = []hostileRow{
	{"server slower than the node timeout", func(t *testing.T, client string) {
		s := redistest.Start(t)
		p := toxi.New(t).Proxy(s.Addr())
		m := hostileMutex(t, client, p.Addr(), "slow", netlock.WithNodeTimeout(100*time.Millisecond), netlock.WithOutageWindow(hostileOutage))
		mustLock(t, m)
		mustUnlock(t, m)
		if err := p.Add("slow", toxi.Latency("upstream", 400, 0)); err != nil {
			t.Fatal(err)
		}
		err := lockWithin(t, m)
		wantNodeErr(t, "LockCtx through 400ms of latency", err, "")
		// The acquire reaches the server late, after its release (or meets
		// the release's tombstone): the key must not stay.
		p.Remove("slow")
		eventuallyFree(t, s, m)
		mustLock(t, m)
		mustUnlock(t, m)
	}},

	{"context cancelled mid-acquire", func(t *testing.T, client string) {
		s := redistest.Start(t)
		p := toxi.New(t).Proxy(s.Addr())
		m := hostileMutex(t, client, p.Addr(), "midway", netlock.WithNodeTimeout(2*time.Second))
		mustLock(t, m)
		mustUnlock(t, m)
		if err := p.Add("slow", toxi.Latency("upstream", 300, 0)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel) // while the acquire is on its way
		var err error
		redistest.Within(t, 5*time.Second, "LockCtx", func() { err = m.LockCtx(ctx) })
		if !errors.Is(err, netlock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Errorf("LockCtx cancelled midway: got %v, want ErrNotObtained and context.Canceled", err)
		}
		p.Remove("slow")
		eventuallyFree(t, s, m)
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, netlock.ErrNotHeld) {
			t.Errorf("UnlockCtx after a cancelled LockCtx: got %v, want ErrNotHeld", err)
		}
	}},

	{"server closes connections mid-reply", func(t *testing.T, client string) {
		s := redistest.Start(t)
		p := toxi.New(t).Proxy(s.Addr())
		m := hostileMutex(t, client, p.Addr(), "cutoff", netlock.WithNodeTimeout(500*time.Millisecond), netlock.WithOutageWindow(hostileOutage))
		mustLock(t, m)
		mustUnlock(t, m)
		// Every reply is cut after 5 bytes: "*3\r\n:" of the acquire's.
		if err := p.Add("cut", toxi.LimitData("downstream", 5)); err != nil {
			t.Fatal(err)
		}
		if err := p.Cut(); err != nil { // so that every connection counts from now
			t.Fatal(err)
		}
		err := lockWithin(t, m)
		wantNodeErr(t, "LockCtx with replies cut off", err, "")
		// The acquire ran on the server; the release sent after it, or the
		// reaper's once replies come through again, deletes the key.
		if err := p.Cut("cut"); err != nil {
			t.Fatal(err)
		}
		eventuallyFree(t, s, m)
		relock(t, m)
		reunlock(t, s, m)
	}},
}

// hostileOutage is the outage window of the rows whose server never
// answers: LockCtx rides it out, then reports the nodes' errors.
const hostileOutage = 300 * time.Millisecond

// hostileMutex returns a NetMutex for name on one backend of its own on addr.
func hostileMutex(t *testing.T, client, addr, name string, opts ...netlock.Option) *netlock.NetMutex {
	t.Helper()
	m, err := netlock.New(name, []netlock.Backend{newBackend(t, client, addr)}, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return m
}

// lockWithin calls LockCtx, failing the test if it does not return within 5s.
func lockWithin(t *testing.T, m *netlock.NetMutex) (err error) {
	t.Helper()
	redistest.Within(t, 5*time.Second, "LockCtx", func() { err = m.LockCtx(context.Background()) })
	return err
}

// relock locks m after its connections were cut (a restart, a proxy's cut):
// the first call may meet a cut connection and fail with a node error, but
// a few calls lock it, and no error is other than a node error.
func relock(t *testing.T, m *netlock.NetMutex) {
	t.Helper()
	var err error
	for range 3 {
		if err = lockWithin(t, m); err == nil {
			return
		}
		wantNodeErr(t, "LockCtx after the connections were cut", err, "")
		if strings.Contains(err.Error(), "NOSCRIPT") {
			t.Errorf("NOSCRIPT reached the caller: %v", err)
		}
	}
	t.Fatalf("LockCtx after the connections were cut, 3 tries: %v", err)
}

// reunlock unlocks m after its connections were cut: the release may meet
// another cut connection (a client library may have several) and fail with
// a node error, and then the reaper delivers it: either way the key goes.
func reunlock(t *testing.T, s *redistest.Server, m *netlock.NetMutex) {
	t.Helper()
	if err := m.UnlockCtx(context.Background()); err != nil {
		wantNodeErr(t, "UnlockCtx after the connections were cut", err, "")
	}
	eventuallyFree(t, s, m)
}

// wantNodeErr fails the test unless err is a node error, as it must be
// when a node cannot be asked: it matches ErrQuorum, names node 0, starts
// "netlock: ", and contains want.
func wantNodeErr(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || !errors.Is(err, netlock.ErrQuorum) || !strings.HasPrefix(err.Error(), "netlock: ") ||
		!strings.Contains(err.Error(), "node 0") || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: got %v, want an error matching ErrQuorum, naming node 0 and containing %q", what, err, want)
	}
}

// eventuallyFree fails the test unless m's lock key is gone from s within
// 3s (late requests settle, the reaper delivers its releases) and stays gone
// for 300ms more.
func eventuallyFree(t *testing.T, s *redistest.Server, m *netlock.NetMutex) {
	t.Helper()
	key := lockKey(m.Name())
	deadline := time.Now().Add(3 * time.Second)
	for sdo(t, s, "EXISTS", key) != "0" {
		if time.Now().After(deadline) {
			t.Fatalf("lock key %q still there 3s after the failed acquire", key)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if sdo(t, s, "EXISTS", key) != "0" {
			t.Fatalf("lock key %q came back after the failed acquire", key)
		}
	}
}

// sdo runs a command on s and fails the test on error.
func sdo(t *testing.T, s *redistest.Server, args ...string) string {
	t.Helper()
	v, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return v
}
