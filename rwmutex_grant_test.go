package netlock

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// Tests of the grants a NetRWMutex's releases make (lua/rw_wake.lua): over
// one backend, the last read lease's release grants the first writer the
// write lock, and a writer's release grants the readers' processes ahead of
// the next writer their leases, each told by a message and holding without
// an attempt of its own. A grant to a waiter whose process died is undone
// or expires; one to a waiter that gave up is released.

// grantProc is a process of a NetRWMutex, with the scripts it ran counted.
type grantProc struct {
	*NetRWMutex
	b *countingBackend
}

// acquires returns how many acquire scripts the process ran.
func (p grantProc) acquires() int { return p.b.count(rwAcquireScript.Name()) }

// rwGrantPair returns two processes of one NetRWMutex name on srv, each
// with a holder identity of its own.
func rwGrantPair(t *testing.T, srv *miniredis.Miniredis, name string) (a, b grantProc) {
	t.Helper()
	newRW := func() grantProc {
		cb := counting(newBackend(t, "redigo", srv.Addr()))
		rw, err := NewRW(name, []Backend{cb}, WithExpiry(3*time.Second), WithHolderInfo("proc "+rand.Text()))
		if err != nil {
			t.Fatal(err)
		}
		if !rw.w.grants || !rw.r.grants {
			t.Fatal("grants are off over one backend")
		}
		return grantProc{rw, cb}
	}
	return newRW(), newRW()
}

// checkGrantHolder checks that the hold a release granted m is written with
// m's holder identity (not the releaser's): in the writer key, or in the
// read lease's value.
func checkGrantHolder(t *testing.T, srv *miniredis.Miniredis, m *engine) {
	t.Helper()
	k := m.kind.(*rwSide).keys
	h := m.current()
	var got string
	if m.kind.(*rwSide).mode == 'w' {
		v, _ := srv.Get(k.Writer)
		got = keyspace.HolderOf(v)
	} else if _, err := srv.ZScore(k.Leases, h.value); err == nil {
		got = keyspace.LeaseHolder(h.value)
	}
	if got != m.cfg.holderInfo {
		t.Errorf("granted hold %q: holder %q, want its own, %q", h.value, got, m.cfg.holderInfo)
	}
}

// TestRWGrantWriter: a writer waiting behind a read lease is granted the
// write lock by the lease's release, with the next fencing token, and adopts
// it from the message: its LockCtx returns without another acquire.
func TestRWGrantWriter(t *testing.T) {
	srv := miniredis.RunT(t)
	a, b := rwGrantPair(t, srv, "grantw")
	ctx := context.Background()
	a.RLock()
	errc := make(chan error, 1)
	go func() { errc <- b.LockCtx(ctx) }()
	eventually(t, 5*time.Second, "b's writer refused and listening", func() bool { return listening(srv, b.w.waitChan) && b.acquires() >= 2 })
	before := b.acquires()
	a.RUnlock()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if h := b.w.current(); !grantedValue(h) {
		t.Fatalf("the writer holds %+v, not a release's grant", h)
	}
	if n := b.acquires() - before; n != 0 {
		t.Errorf("the writer made %d acquire rounds after the release; a grant needs none", n)
	}
	cur, _ := srv.Get(a.keys.Writer)
	if tok := b.Token(); tok == 0 || !strings.Contains(cur, ":"+strconv.FormatUint(tok, 10)+":") {
		t.Errorf("writer key %q, token %d: the grant's token must be in the key", cur, tok)
	}
	checkGrantHolder(t, srv, b.w)
	b.Unlock()
	if srv.Exists(a.keys.Writer) {
		t.Fatal("the granted write lock outlived its Unlock")
	}
	// The token goes on increasing after a grant.
	tok := b.Token()
	a.Lock()
	if a.Token() <= tok {
		t.Errorf("token %d after the granted %d", a.Token(), tok)
	}
	a.Unlock()
}

// TestRWGrantReaders: readers of two processes waiting behind a writer are
// granted their leases by its release, ahead of a writer that came after
// them; each process's lease is shared by its readers, and released by the
// last.
func TestRWGrantReaders(t *testing.T) {
	srv := miniredis.RunT(t)
	a, b := rwGrantPair(t, srv, "grantr")
	c, d := rwGrantPair(t, srv, "grantr")
	ctx := context.Background()
	a.Lock()
	errc := make(chan error, 2)
	go func() { errc <- b.RLockCtx(ctx) }()
	eventually(t, 5*time.Second, "b's reader queued", func() bool { n, _ := srv.ZMembers(a.keys.Readers); return len(n) == 1 })
	go func() { errc <- c.RLockCtx(ctx) }()
	eventually(t, 5*time.Second, "c's reader queued", func() bool { n, _ := srv.ZMembers(a.keys.Readers); return len(n) == 2 })
	eventually(t, 5*time.Second, "both readers refused and listening", func() bool {
		return listening(srv, b.r.waitChan) && listening(srv, c.r.waitChan) && b.acquires() >= 2 && c.acquires() >= 2
	})
	// A writer that came after them.
	werr := make(chan error, 1)
	go func() { werr <- d.LockCtx(ctx) }()
	eventually(t, 5*time.Second, "d's writer queued", func() bool { return srv.Exists(a.keys.Writers) })
	rb, rc := b.acquires(), c.acquires()
	a.Unlock()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []grantProc{b, c} {
		if h := p.r.current(); !grantedValue(h) {
			t.Fatalf("a reader holds %+v, not a release's grant", h)
		}
		checkGrantHolder(t, srv, p.r)
		if !p.lease.writerWaits.Load() {
			t.Error("a granted lease was not told that a writer waits")
		}
	}
	if b.acquires() != rb || c.acquires() != rc {
		t.Error("a granted reader made an acquire round after the release")
	}
	select {
	case err := <-werr:
		t.Fatalf("the later writer got in while readers held: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.RUnlock()
	c.RUnlock()
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if h := d.w.current(); !grantedValue(h) {
		t.Errorf("the writer after the readers holds %+v, not the last lease's grant", h)
	}
	checkGrantHolder(t, srv, d.w)
	d.Unlock()
}

// fakeWaiter queues a waiter of the NetRWMutex keys k of kind 'r' or 'w' in
// Redis as a process would, under a grant-taking member, without a
// process behind it; with listen, a connection subscribes to its channel
// (a process that hears the grant and then dies, or gives up). It returns
// the member and the grant's value.
func fakeWaiter(t *testing.T, srv *miniredis.Miniredis, k rwKeys, kind byte, arrival int64, listen bool) (member, value string) {
	t.Helper()
	id := "fake" + string(kind)
	member = id + "+3000+NONCE" + string(kind)
	queue := k.Readers
	if kind == 'w' {
		queue = k.Writers
	}
	if _, err := srv.ZAdd(queue, float64(arrival), member); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.ZAdd(k.Leases, -float64(time.Now().Add(time.Minute).UnixMilli()), "q:"+member); err != nil {
		t.Fatal(err)
	}
	if listen {
		c, err := redis.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.Send("SUBSCRIBE", k.Channel+":"+string(kind)+":"+id); err != nil {
			t.Fatal(err)
		}
		c.Flush()
		if _, err := c.Receive(); err != nil {
			t.Fatal(err)
		}
	}
	if kind == 'r' {
		return member, "NONCEr.1"
	}
	return member, "NONCEw."
}

// TestRWGrantDeadWriter: the first writer's process died without its
// connection closing (it hears, never adopts): the grant it is made expires
// with its TTL, and the next writer gets in then. One whose connection is
// gone (nobody hears): its grant is undone at once, and the next writer is
// granted the lock.
func TestRWGrantDeadWriter(t *testing.T) {
	for _, listen := range []bool{true, false} {
		srv := miniredis.RunT(t)
		a, b := rwGrantPair(t, srv, "deadw")
		k := a.keys
		ctx := context.Background()
		a.RLock()
		fakeWaiter(t, srv, k, 'w', time.Now().UnixMicro(), listen)
		errc := make(chan error, 1)
		go func() { errc <- b.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "b's writer refused and listening", func() bool { return listening(srv, b.w.waitChan) && b.acquires() >= 2 })
		a.RUnlock()
		cur, _ := srv.Get(k.Writer)
		if listen {
			if !strings.HasPrefix(cur, "NONCEw.") {
				t.Fatalf("writer key %q: the first writer, heard, was not granted the lock", cur)
			}
			if ttl := srv.TTL(k.Writer); ttl <= 0 || ttl > 3*time.Second {
				t.Fatalf("a granted lock's TTL %v: want the waiter's expiry, 3s", ttl)
			}
			select {
			case err := <-errc:
				t.Fatalf("the second writer got in while the grant to the first was live: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
			srv.FastForward(3 * time.Second) // the grant expires
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !listen {
			if h := b.w.current(); !grantedValue(h) {
				t.Errorf("the next writer holds %+v: not granted when the dead first one's grant was undone", h)
			}
		}
		b.Unlock()
	}
}

// TestRWGrantLeft: a grant made to a waiter that gave up before adopting it
// is released by its leave (lua/rw_leave.lua), and the waiters it kept out
// get in at once: a writer granted, then readers granted.
func TestRWGrantLeft(t *testing.T) {
	srv := miniredis.RunT(t)
	a, b := rwGrantPair(t, srv, "left")
	k := a.keys
	ctx := context.Background()

	// A writer granted the lock by a lease's release leaves.
	a.RLock()
	member, _ := fakeWaiter(t, srv, k, 'w', time.Now().UnixMicro(), true)
	errc := make(chan error, 1)
	go func() { errc <- b.LockCtx(ctx) }()
	eventually(t, 5*time.Second, "b's writer refused and listening", func() bool { return listening(srv, b.w.waitChan) && b.acquires() >= 2 })
	a.RUnlock()
	if cur, _ := srv.Get(k.Writer); !strings.HasPrefix(cur, "NONCEw.") {
		t.Fatalf("writer key %q: the first writer was not granted the lock", cur)
	}
	a.w.leave(ctx, member, nil)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		t.Fatal("the writer after one that left its grant was not let in")
	}
	if cur, _ := srv.Get(k.Writer); strings.HasPrefix(cur, "NONCEw.") {
		t.Fatal("the grant of the writer that left is still there")
	}

	// A reader granted a lease by the writer's release leaves.
	member, value := fakeWaiter(t, srv, k, 'r', time.Now().UnixMicro(), true)
	werr := make(chan error, 1)
	go func() { werr <- a.LockCtx(ctx) }()
	eventually(t, 5*time.Second, "a's writer refused and listening", func() bool { return listening(srv, a.w.waitChan) && a.acquires() >= 2 })
	b.Unlock()
	if s, err := srv.ZScore(k.Leases, value); err != nil || s <= 0 {
		t.Fatalf("the reader ahead of the writer was not granted its lease (%v, %v)", s, err)
	}
	a.w.leave(ctx, member, nil)
	select {
	case err := <-werr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		t.Fatal("the writer after a reader that left its grant was not let in")
	}
	if _, err := srv.ZScore(k.Leases, value); err == nil {
		t.Fatal("the lease of the reader that left is still there")
	}
	a.Unlock()
}

// TestRWGrantDeadReader: readers ahead of a writer whose process is gone
// (nobody hears their grant) do not keep it out: their grants are undone
// at once, and the writer behind them is granted the lock.
func TestRWGrantDeadReader(t *testing.T) {
	srv := miniredis.RunT(t)
	a, b := rwGrantPair(t, srv, "deadr")
	k := a.keys
	ctx := context.Background()
	a.Lock()
	_, value := fakeWaiter(t, srv, k, 'r', time.Now().UnixMicro(), false)
	errc := make(chan error, 1)
	go func() { errc <- b.LockCtx(ctx) }()
	eventually(t, 5*time.Second, "b's writer refused and listening", func() bool { return listening(srv, b.w.waitChan) && b.acquires() >= 2 })
	a.Unlock()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		t.Fatal("a writer behind a dead reader was not let in")
	}
	if h := b.w.current(); !grantedValue(h) {
		t.Errorf("the writer holds %+v: not granted when the dead reader's grant was undone", h)
	}
	if _, err := srv.ZScore(k.Leases, value); err == nil {
		t.Error("the dead reader's lease is still there")
	}
	if n, _ := srv.ZMembers(k.Readers); len(n) != 0 {
		t.Errorf("readers' queue %v: the dead reader is still queued", n)
	}
	b.Unlock()
}
