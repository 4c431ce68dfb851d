package netlock

import (
	"context"
	"strings"
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
