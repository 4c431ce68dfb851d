package netlock

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// TestOrphanGrantReleased: a release grants the lock to a waiter's place
// that outlived the waiter (a join the network held back past its leave),
// while the waiter's Hub still listens on its channel (hubLinger after the
// waiter stopped), so the release counts it as heard. Nobody would take the
// grant up before it expired; the Hub hands the message to its NetMutex,
// which releases the grant at once, and the next waiter gets in.
func TestOrphanGrantReleased(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		expiry := 5 * time.Second // a grant left to expire would keep c out for it
		holder := e.newMutex(t, "orphan", WithExpiry(expiry))
		ghost := e.newMutex(t, "orphan", WithExpiry(expiry))
		next := e.newMutex(t, "orphan", WithExpiry(expiry))
		if !ghost.grants {
			t.Skipf("%s: releases do not grant by message here", e.client)
		}
		mustLock(t, holder)

		// The ghost's waiter queues, then gives up: its leave takes its
		// place off the queue.
		ctx, cancel := context.WithCancel(context.Background())
		gave := make(chan error, 1)
		go func() { gave <- ghost.LockCtx(ctx) }()
		var member string
		eventually(t, 5*time.Second, "the waiter queued", func() bool {
			q, _ := redis.Strings(e.do(t, "ZRANGE", ghost.keys.waiters, 0, -1), nil)
			for _, m := range q {
				if strings.HasPrefix(m, ghost.waiterID+"+") {
					member = m
				}
			}
			return member != ""
		})
		cancel()
		if err := <-gave; err == nil {
			t.Fatal("LockCtx with a cancelled ctx: got nil")
		}
		// Its join again, late, as the network may deliver it.
		e.do(t, "ZADD", ghost.keys.waiters, 0, member)
		if n, _ := redis.Values(e.do(t, "PUBSUB", "NUMSUB", ghost.waitChan), nil); len(n) != 2 || n[1] != int64(1) {
			t.Fatalf("the ghost's Hub no longer listens on its channel (PUBSUB NUMSUB %v): the test needs it to, within hubLinger", n)
		}
		released := time.Now()
		mustUnlock(t, holder)

		lockCtx, stop := context.WithTimeout(context.Background(), expiry/2)
		defer stop()
		if err := next.LockCtx(lockCtx); err != nil {
			v, _ := redis.String(e.do(t, "GET", holder.keys.lock), nil)
			t.Fatalf("the next waiter: %v after %v (the lock key holds %q: the grant to the place left behind)", err, time.Since(released).Round(time.Millisecond), v)
		}
		mustUnlock(t, next)
	})
}

// TestOrphanOnlyWithoutWatch: the Hub hands a message to the channel's
// orphan handler only while no waiter watches the channel.
func TestOrphanOnlyWithoutWatch(t *testing.T) {
	var got []string
	h := NewHub(HubConfig{})
	l := &link{}
	wake := make(chan string, 1)
	w := &watch{hub: h, wake: wake}
	tp := &topic{channel: "c", link: l, watches: map[*watch]struct{}{w: {}}, orphan: func(p string) { got = append(got, p) }}
	w.topic = tp
	h.topics = map[string]*topic{"c": tp}

	h.dispatch(l, "c", "g:n:1:1")
	if len(got) != 0 || <-wake != "g:n:1:1" {
		t.Fatalf("with a watch: orphan got %q, want the watch to get the message", got)
	}
	delete(tp.watches, w)
	h.dispatch(l, "c", "g:n:2:2")
	if len(got) != 1 || got[0] != "g:n:2:2" {
		t.Fatalf("without a watch: orphan got %q, want [g:n:2:2]", got)
	}
	h.dispatch(&link{}, "c", "g:n:3:3") // another link's: not this topic's
	if len(got) != 1 {
		t.Fatalf("a message of another link: orphan got %q", got)
	}
}

// TestOrphanAfterUnsubscribe: a message on a channel the Hub unsubscribed
// (the server may have published it before it had the UNSUBSCRIBE) still
// reaches the channel's orphan handler, on the link it was subscribed
// through, until leftKeep has passed or the link is closed; and a channel
// subscribed again takes its messages back.
func TestOrphanAfterUnsubscribe(t *testing.T) {
	l := newStuckListener("")
	h := NewHub(HubConfig{Listen: func(context.Context, func(string, string)) (Listener, error) { return l, nil }})
	var mu sync.Mutex
	var got []string
	orphan := func(p string) { mu.Lock(); got = append(got, p); mu.Unlock() }
	gotten := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(got) }
	ctx := context.Background()
	// "keep" keeps the link open while "c" is unsubscribed.
	keep, err := h.watch(ctx, "keep", make(chan string, 1))
	if err != nil {
		t.Fatal(err)
	}
	w, err := h.watchFor(ctx, "c", make(chan string, 1), orphan)
	if err != nil {
		t.Fatal(err)
	}
	ln := w.topic.link
	w.stop()
	eventually(t, 5*time.Second, "the idle channel unsubscribed", func() bool { return !h.subscribed("c") })

	h.dispatch(ln, "c", "g:n:1:1")
	if g := gotten(); !slices.Equal(g, []string{"g:n:1:1"}) {
		t.Fatalf("a message after the unsubscribe: orphan got %q, want [g:n:1:1]", g)
	}
	h.dispatch(&link{}, "c", "g:n:2:2") // another link's
	h.dispatch(ln, "other", "g:n:3:3")  // a channel that had no handler
	if g := gotten(); len(g) != 1 {
		t.Fatalf("messages of another link or channel: orphan got %q", g)
	}

	// Subscribed again: its messages are the new watch's.
	wake := make(chan string, 1)
	w2, err := h.watch(ctx, "c", wake)
	if err != nil {
		t.Fatal(err)
	}
	h.dispatch(ln, "c", "g:n:4:4")
	if g := gotten(); len(g) != 1 || <-wake != "g:n:4:4" {
		t.Fatalf("subscribed again: orphan got %q, want the watch to get the message", g)
	}
	w2.stop()
	eventually(t, 5*time.Second, "the idle channel unsubscribed again", func() bool { return !h.subscribed("c") })
	h.dispatch(ln, "c", "g:n:5:5")
	if g := gotten(); len(g) != 1 {
		t.Fatalf("unsubscribed after a watch without a handler: orphan got %q, want nothing more", g)
	}

	// Kept for leftKeep only.
	w3, err := h.watchFor(ctx, "d", make(chan string, 1), orphan)
	if err != nil {
		t.Fatal(err)
	}
	w3.stop()
	eventually(t, 5*time.Second, "d unsubscribed", func() bool { return !h.subscribed("d") })
	h.wmu.Lock()
	lt := h.left["d"]
	lt.at = lt.at.Add(-leftKeep)
	h.left["d"] = lt
	h.wmu.Unlock()
	h.dispatch(ln, "d", "g:n:6:6")
	if g := gotten(); len(g) != 1 {
		t.Fatalf("after leftKeep: orphan got %q, want nothing more", g)
	}
	h.sweepIdle()
	h.wmu.Lock()
	_, kept := h.left["d"]
	h.wmu.Unlock()
	if kept {
		t.Fatal("after leftKeep and a sweep: the handler is still kept")
	}

	// Dropped with the link.
	w4, err := h.watchFor(ctx, "e", make(chan string, 1), orphan)
	if err != nil {
		t.Fatal(err)
	}
	w4.stop()
	eventually(t, 5*time.Second, "e unsubscribed", func() bool { return !h.subscribed("e") })
	keep.stop()
	h.mu.Lock()
	h.failLocked(ln)
	h.mu.Unlock()
	h.wmu.Lock()
	n := len(h.left)
	h.wmu.Unlock()
	if n != 0 {
		t.Fatalf("after the link closed: %d channels' handlers kept, want 0", n)
	}
}
