package netlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// hostileRow is one bad input or hostile environment and what must happen
// then, checked on a real redis-server with one client library.
type hostileRow struct {
	name string
	run  func(t *testing.T, client string)
}

// TestBadInput runs every bad input and hostile environment of the table
// with each client library, on real redis-servers: bad input to New,
// a server down or stalled, keys of another type, scripts flushed or lost in
// a restart, a context done before the acquire, Unlock without a hold
// (twice, or from another NetMutex), holds lost (expired, stolen, the node's
// data lost), another client's value, a wrong password, an ACL user without
// EVAL rights, and a NetMutex not made by New. Every failure must be a clear
// error naming the node, matching the documented sentinels, never a hang,
// never a key left behind or another's key touched.
//
// The rows that need a network that misbehaves (a server slower than the
// node timeout, a context cancelled while the acquire is on its way, replies
// cut off mid-way) go through toxiproxy, and are the chaos module's
// TestBadInput (chaos/badinput_test.go), so that toxiproxy stays out of this
// module.
func TestBadInput(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			for _, row := range hostileRows {
				t.Run(row.name, func(t *testing.T) { row.run(t, client) })
			}
		})
	}
}

var hostileRows = []hostileRow{
	{"New rejects bad input", func(t *testing.T, client string) {
		// The full set is TestNewRejectsBadInput, FuzzName and FuzzOptions;
		// here, that New never needs a server to say no.
		s := redistest.Start(t)
		b := newBackend(t, client, s.Addr())
		for _, c := range []struct {
			name     string
			backends []Backend
			opts     []Option
		}{
			{"", []Backend{b}, nil},
			{"n", nil, nil},
			{"n", []Backend{b, nil}, nil},
			{"n", []Backend{b}, []Option{WithExpiry(0)}},
			{"n", []Backend{b}, []Option{WithDriftFactor(0.5)}},
			{"n", []Backend{b}, []Option{WithNodeTimeout(DefaultExpiry)}},
			{"n", []Backend{b}, []Option{WithPrefix("p{")}},
			{"n", []Backend{b}, []Option{WithHolderInfo("host\n42")}},
			{"n", []Backend{b}, []Option{WithHolderInfo(strings.Repeat("h", MaxHolderInfo+1))}},
		} {
			if m, err := New(c.name, c.backends, c.opts...); m != nil || err == nil || !strings.HasPrefix(err.Error(), "netlock: ") {
				t.Errorf("New(%q, %d backends, %d options): got %v, %v; want a clear error", c.name, len(c.backends), len(c.opts), m, err)
			}
		}
	}},

	{"server refuses connections", func(t *testing.T, client string) {
		// rueidis dials when its client is made: the server is there then,
		// and gone before the lock is asked for.
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "down", WithNodeTimeout(200*time.Millisecond), WithOutageWindow(hostileOutage))
		s.Kill()
		err := lockWithin(t, m)
		wantNodeErr(t, "LockCtx on a refused server", err, "")
		if perr := recoverErr(m.Lock); !errors.Is(perr, ErrQuorum) {
			t.Errorf("Lock on a refused server: got panic %v, want one matching ErrQuorum", perr)
		}
		redistest.Within(t, 5*time.Second, "TryLockCtx", func() {
			if ok, err := m.TryLockCtx(context.Background()); ok || !errors.Is(err, ErrQuorum) {
				t.Errorf("TryLockCtx on a refused server: got %v, %v; want false and ErrQuorum", ok, err)
			}
		})
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("UnlockCtx after failed attempts: got %v, want ErrNotHeld", err)
		}
	}},

	{"server stalled (SIGSTOP)", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "stalled", WithNodeTimeout(200*time.Millisecond), WithOutageWindow(hostileOutage))
		mustLock(t, m) // warm up: the stalled call is then a real EVALSHA
		mustUnlock(t, m)
		s.Pause()
		err := lockWithin(t, m)
		s.Resume()
		wantNodeErr(t, "LockCtx on a stalled server", err, "")
		eventuallyFree(t, s, m)
		mustLock(t, m)
		mustUnlock(t, m)
	}},

	{"lock key of another type (WRONGTYPE)", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "wrongtype")
		sdo(t, s, "HSET", m.keys.lock, "field", "kept")
		err := lockWithin(t, m)
		wantNodeErr(t, "LockCtx on a hash", err, "WRONGTYPE")
		if !strings.Contains(fmt.Sprint(err), "another type") || errors.Is(err, ErrNotObtained) {
			t.Errorf("LockCtx on a hash: got %v, want it to say the key holds another type, and no ErrNotObtained", err)
		}
		if v := sdo(t, s, "HGET", m.keys.lock, "field"); v != "kept" {
			t.Errorf("the hash after the failed lock: got %q, want it untouched", v)
		}
		// Nothing written: not even the fence counter (lua/acquire.lua
		// counts the key before it takes a token).
		if v := sdo(t, s, "EXISTS", m.keys.fence); v != "0" {
			t.Error("the fence counter was written although the lock key holds another type")
		}
		if perr := recoverErr(m.Lock); perr == nil || !strings.Contains(perr.Error(), "WRONGTYPE") {
			t.Errorf("Lock on a hash: got panic %v, want the WRONGTYPE error", perr)
		}
	}},

	{"fence key of another type (WRONGTYPE)", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "wrongfence")
		sdo(t, s, "HSET", m.keys.fence, "field", "kept")
		err := lockWithin(t, m)
		wantNodeErr(t, "LockCtx with a hash as fence counter", err, "WRONGTYPE")
		if v := sdo(t, s, "HGET", m.keys.fence, "field"); v != "kept" {
			t.Errorf("the hash after the failed lock: got %q, want it untouched", v)
		}
		if v := sdo(t, s, "EXISTS", m.keys.lock); v != "0" {
			t.Error("the lock key was set although the fence counter could not be read")
		}
	}},

	{"SCRIPT FLUSH", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "flush")
		for range 2 {
			sdo(t, s, "SCRIPT", "FLUSH")
			mustLock(t, m)
			sdo(t, s, "SCRIPT", "FLUSH")
			if err := m.ExtendCtx(context.Background()); err != nil {
				t.Fatalf("ExtendCtx after SCRIPT FLUSH: %v", err)
			}
			sdo(t, s, "SCRIPT", "FLUSH")
			mustUnlock(t, m)
		}
	}},

	{"server restart (scripts and keys gone)", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "restart")
		mustLock(t, m)
		mustUnlock(t, m)
		s.Restart()
		relock(t, m) // the lost scripts never show
		reunlock(t, s, m)
	}},

	{"context already done on entry", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "entry")
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := m.LockCtx(ctx); !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Errorf("LockCtx: got %v, want ErrNotObtained and context.Canceled", err)
		}
		if ok, err := m.TryLockCtx(ctx); ok || !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Errorf("TryLockCtx: got %v, %v; want false, ErrNotObtained and context.Canceled", ok, err)
		}
		if sdo(t, s, "EXISTS", m.keys.lock) != "0" {
			t.Error("lock key created by a call whose context was done")
		}
		mustLock(t, m)
		if err := m.ExtendCtx(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("ExtendCtx with a done context: got %v, want context.Canceled", err)
		}
		if !isOpen(m.Lost()) {
			t.Error("a failed ExtendCtx (done context) lost the hold")
		}
		// Unlock ignores cancellation: the release must happen.
		if err := m.UnlockCtx(ctx); err != nil {
			t.Errorf("UnlockCtx with a done context: %v", err)
		}
		if sdo(t, s, "EXISTS", m.keys.lock) != "0" {
			t.Error("lock key left by UnlockCtx with a done context")
		}
	}},

	{"unlock without a hold", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "unheld")
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("UnlockCtx: got %v, want ErrNotHeld", err)
		}
		wantUnlockPanic(t, m)
		if err := m.ExtendCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("ExtendCtx: got %v, want ErrNotHeld", err)
		}
	}},

	{"unlock twice", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "twice")
		mustLock(t, m)
		mustUnlock(t, m)
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("second UnlockCtx: got %v, want ErrNotHeld", err)
		}
		m.Lock()
		m.Unlock()
		wantUnlockPanic(t, m)
	}},

	{"unlock from another NetMutex of the same name", func(t *testing.T, client string) {
		s := redistest.Start(t)
		a := hostileMutex(t, client, s.Addr(), "other")
		b := hostileMutex(t, client, s.Addr(), "other")
		mustLock(t, a)
		held := sdo(t, s, "GET", a.keys.lock)
		if err := b.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("b.UnlockCtx while a holds: got %v, want ErrNotHeld", err)
		}
		wantUnlockPanic(t, b)
		if err := b.ExtendCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("b.ExtendCtx while a holds: got %v, want ErrNotHeld", err)
		}
		if v := sdo(t, s, "GET", a.keys.lock); v != held {
			t.Errorf("a's key after b's unlock: got %q, want %q", v, held)
		}
		mustUnlock(t, a)
	}},

	{"hold lost: expired", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "expired", WithExpiry(200*time.Millisecond), WithAutoExtend(false),
			WithNodeTimeout(100*time.Millisecond)) // not a tenth of the expiry: a first call may take 20ms
		mustLock(t, m)
		until := holdUntil(m)
		select {
		case <-m.Lost():
			if late := time.Since(until); late > 100*time.Millisecond {
				t.Errorf("Lost() closed %v after the local deadline", late)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Lost() not closed 5s after a 200ms hold without auto-extend")
		}
		wantLost(t, m)
	}},

	{"hold lost: stolen, another client's value untouched", func(t *testing.T, client string) {
		s := redistest.Start(t)
		m := hostileMutex(t, client, s.Addr(), "stolen")
		mustLock(t, m)
		sdo(t, s, "SET", m.keys.lock, "foreign:1", "PX", "60000")
		if err := m.ExtendCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("ExtendCtx of a stolen key: got %v, want ErrLockLost", err)
		}
		wantLost(t, m)
		if v := sdo(t, s, "GET", m.keys.lock); v != "foreign:1" {
			t.Errorf("the other client's key: got %q, want it untouched", v)
		}
		if ttl, _ := strconv.Atoi(sdo(t, s, "PTTL", m.keys.lock)); ttl <= int(DefaultExpiry/time.Millisecond) {
			t.Errorf("the other client's key has %dms left: its TTL was reset by our extend", ttl)
		}
	}},

	{"hold lost: the node lost its data", func(t *testing.T, client string) {
		s := redistest.Start(t) // no persistence: a restart empties it
		m := hostileMutex(t, client, s.Addr(), "amnesia")
		mustLock(t, m)
		s.Restart()
		// The first call may meet the connection the restart cut.
		var err error
		for range 3 {
			if err = m.ExtendCtx(context.Background()); errors.Is(err, ErrLockLost) {
				break
			}
		}
		if !errors.Is(err, ErrLockLost) {
			t.Errorf("ExtendCtx after the node lost the key: got %v, want ErrLockLost", err)
		}
		wantLost(t, m)
	}},

	{"wrong password", func(t *testing.T, client string) {
		s := redistest.Start(t)
		sdo(t, s, "ACL", "SETUSER", "alice", "on", ">right", "~*", "&*", "+@all")
		m, err := New("auth", []Backend{authBackend(t, client, s.Addr(), "alice", "right")}, WithNodeTimeout(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, m)
		mustUnlock(t, m)
		// The password changes and alice's connections are cut: the client
		// must log in again, with the password it has, now wrong.
		sdo(t, s, "ACL", "SETUSER", "alice", "resetpass", ">changed")
		sdo(t, s, "CLIENT", "KILL", "USER", "alice")
		for range 3 {
			if err = lockWithin(t, m); err != nil && strings.Contains(err.Error(), "WRONGPASS") {
				break
			}
		}
		wantNodeErr(t, "LockCtx with a wrong password", err, "WRONGPASS")
	}},

	{"ACL user without EVAL and EVALSHA", func(t *testing.T, client string) {
		s := redistest.Start(t)
		sdo(t, s, "ACL", "SETUSER", "bob", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha")
		m, err := New("acl", []Backend{authBackend(t, client, s.Addr(), "bob", "pw")})
		if err != nil {
			t.Fatal(err)
		}
		err = lockWithin(t, m)
		wantNodeErr(t, "LockCtx without EVAL rights", err, "NOPERM")
		if perr := recoverErr(m.Lock); perr == nil || !strings.Contains(perr.Error(), "NOPERM") {
			t.Errorf("Lock without EVAL rights: got panic %v, want the NOPERM error", perr)
		}
	}},

	{"NetMutex not made by New", func(t *testing.T, client string) {
		var z NetMutex
		ctx := context.Background()
		for what, err := range map[string]error{
			"LockCtx":   z.LockCtx(ctx),
			"UnlockCtx": z.UnlockCtx(ctx),
			"ExtendCtx": z.ExtendCtx(ctx),
			"TryLockCtx": func() error {
				ok, err := z.TryLockCtx(ctx)
				if ok {
					t.Error("TryLockCtx on the zero value: got true")
				}
				return err
			}(),
			"Do": func() error {
				_, err := Do(ctx, &z, func(context.Context) (int, error) {
					t.Error("Do ran fn on the zero value")
					return 0, nil
				})
				return err
			}(),
		} {
			if err == nil || !strings.HasPrefix(err.Error(), "netlock: ") || !strings.Contains(err.Error(), "New") {
				t.Errorf("%s on the zero value: got %v, want an error saying to use New", what, err)
			}
		}
		for what, fn := range map[string]func(){"Lock": z.Lock, "Unlock": z.Unlock, "TryLock": func() { z.TryLock() }} {
			if err := recoverErr(fn); err == nil || !strings.Contains(err.Error(), "New") {
				t.Errorf("%s on the zero value: got panic %v, want one saying to use New", what, err)
			}
		}
		if z.Token() != 0 || isOpen(z.Lost()) || z.Name() != "" {
			t.Errorf("zero value: Token %d, Lost open %v, Name %q; want 0, closed, empty", z.Token(), isOpen(z.Lost()), z.Name())
		}
		var nilMutex *NetMutex
		if err := nilMutex.LockCtx(ctx); err == nil || !strings.Contains(err.Error(), "New") {
			t.Errorf("LockCtx on a nil *NetMutex: got %v, want an error saying to use New", err)
		}
		if nilMutex.Token() != 0 || isOpen(nilMutex.Lost()) || nilMutex.Name() != "" {
			t.Errorf("nil *NetMutex: Token %d, Lost open %v, Name %q; want 0, closed, empty", nilMutex.Token(), isOpen(nilMutex.Lost()), nilMutex.Name())
		}
	}},
}

// hostileMutex returns a NetMutex for name on one backend of its own on addr.
func hostileMutex(t *testing.T, client, addr, name string, opts ...Option) *NetMutex {
	t.Helper()
	m, err := New(name, []Backend{newBackend(t, client, addr)}, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return m
}

// authBackend returns a Backend that logs in as user with password.
func authBackend(t *testing.T, client, addr, user, password string) Backend {
	t.Helper()
	switch client {
	case "redigo":
		pool := &redis.Pool{
			MaxIdle: 4,
			DialContext: func(ctx context.Context) (redis.Conn, error) {
				return redis.DialContext(ctx, "tcp", addr, redis.DialUsername(user), redis.DialPassword(password))
			},
		}
		t.Cleanup(func() { pool.Close() })
		return NewRedigo(pool)
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress: []string{addr}, Username: user, Password: password, DisableCache: true,
		})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%s as %s): %v", addr, user, err)
		}
		t.Cleanup(c.Close)
		return NewRueidis(c)
	}
	return openRegistered(t, client, TestClientConfig{Addr: addr, Username: user, Password: password})
}

// relock locks m after its connections were cut (a restart, a proxy's cut):
// the first call may meet a cut connection and fail with a node error, but
// a few calls lock it, and no error is other than a node error.
func relock(t *testing.T, m *NetMutex) {
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
func reunlock(t *testing.T, s *redistest.Server, m *NetMutex) {
	t.Helper()
	if err := m.UnlockCtx(context.Background()); err != nil {
		wantNodeErr(t, "UnlockCtx after the connections were cut", err, "")
	}
	eventuallyFree(t, s, m)
}

// wantUnlockPanic fails the test unless m.Unlock panics as sync.Mutex's
// does on an unlocked mutex, with an error matching ErrNotHeld.
func wantUnlockPanic(t *testing.T, m *NetMutex) {
	t.Helper()
	err := recoverErr(m.Unlock)
	if !errors.Is(err, ErrNotHeld) || err.Error() != "netlock: unlock of unlocked mutex" {
		t.Errorf("Unlock without a hold: got panic %v, want \"netlock: unlock of unlocked mutex\" matching ErrNotHeld", err)
	}
}

// wantLost fails the test unless m's hold is known lost: Lost() closed,
// ExtendCtx and UnlockCtx reporting ErrLockLost.
func wantLost(t *testing.T, m *NetMutex) {
	t.Helper()
	if isOpen(m.Lost()) {
		t.Error("Lost() still open")
	}
	if err := m.ExtendCtx(context.Background()); !errors.Is(err, ErrLockLost) {
		t.Errorf("ExtendCtx of a lost hold: got %v, want ErrLockLost", err)
	}
	if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
		t.Errorf("UnlockCtx of a lost hold: got %v, want ErrLockLost", err)
	}
}

// eventuallyFree fails the test unless m's lock key is gone from s within
// 3s (late requests settle, the reaper delivers its releases) and stays gone
// for 300ms more.
func eventuallyFree(t *testing.T, s *redistest.Server, m *NetMutex) {
	t.Helper()
	eventually(t, 3*time.Second, fmt.Sprintf("lock key %q gone after the failed acquire", m.keys.lock), func() bool {
		return sdo(t, s, "EXISTS", m.keys.lock) == "0"
	})
	// Looked at every 20ms for 300ms: that it stays gone is a check over a
	// period, not an ordering.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if sdo(t, s, "EXISTS", m.keys.lock) != "0" {
			t.Fatalf("lock key %q came back after the failed acquire", m.keys.lock)
		}
	}
}

// holdUntil returns the local deadline of m's current hold (zero if none).
func holdUntil(m *NetMutex) time.Time {
	if h := m.current(); h != nil {
		until, _ := h.deadline()
		return until
	}
	return time.Time{}
}
