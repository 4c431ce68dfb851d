package chaos

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// An evalTrace keeps the latest script calls of a chaos test's clients, so
// that a key found stranded at the end can be told by the calls that
// touched it (see checkStrandedRW). It keeps the last traceSize calls: the
// key's story is near the end of the run.
type evalTrace struct {
	mu    sync.Mutex
	calls []traceCall // a ring: next is where the next call goes
	next  int
	full  bool
}

const traceSize = 1 << 15

type traceCall struct {
	client     int
	script     string
	args       string
	reply      string
	start, end time.Time
}

func newEvalTrace() *evalTrace {
	return &evalTrace{calls: make([]traceCall, traceSize)}
}

// add records one call of client's.
func (t *evalTrace) add(client int, script string, args []string, vals []int64, err error, start, end time.Time) {
	reply := fmt.Sprint(vals)
	if err != nil {
		reply = "error: " + err.Error()
	}
	c := traceCall{client: client, script: script, args: strings.Join(args, " "), reply: reply, start: start, end: end}
	t.mu.Lock()
	t.calls[t.next] = c
	t.next = (t.next + 1) % len(t.calls)
	t.full = t.full || t.next == 0
	t.mu.Unlock()
}

// about returns the recorded calls whose arguments contain s, oldest
// first, one per line, timed from base.
func (t *evalTrace) about(s string, base time.Time) string {
	return t.lines(base, func(c *traceCall) bool { return strings.Contains(c.args, s) })
}

// leftInFault reports whether the latest recorded call whose arguments
// contain nonce is a leave (script leave) that failed: the waiter of
// nonce gave up its place, and its process could not tell the server (a
// fault held the call back past its node timeout).
func (t *evalTrace) leftInFault(nonce, leave string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range len(t.calls) {
		c := &t.calls[(t.next-1-i+2*len(t.calls))%len(t.calls)]
		if c.script == "" {
			return false // before the first call: none named nonce
		}
		if strings.Contains(c.args, nonce) {
			return c.script == leave && strings.HasPrefix(c.reply, "error: ")
		}
	}
	return false
}

// window returns the recorded calls of client that overlap [from, to],
// oldest first, one per line, timed from base.
func (t *evalTrace) window(client int, from, to, base time.Time) string {
	return t.lines(base, func(c *traceCall) bool { return c.client == client && !c.end.Before(from) && !c.start.After(to) })
}

func (t *evalTrace) lines(base time.Time, keep func(*traceCall) bool) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	n := t.next
	if t.full {
		n = len(t.calls)
	}
	for i := range n {
		c := &t.calls[i]
		if t.full {
			c = &t.calls[(t.next+i)%len(t.calls)]
		}
		if keep(c) {
			fmt.Fprintf(&b, "  %v–%v client %d %s %s → %s\n", c.start.Sub(base).Round(time.Microsecond), c.end.Sub(base).Round(time.Microsecond), c.client, c.script, c.args, c.reply)
		}
	}
	return b.String()
}

// TestLeftInFault: leftInFault looks at the latest call naming the nonce
// only, across the ring's wrap.
func TestLeftInFault(t *testing.T) {
	tr := &evalTrace{calls: make([]traceCall, 4)}
	at := time.Now()
	failed := errors.New("context deadline exceeded")
	if tr.leftInFault("N", "rw_leave") {
		t.Error("an empty trace: got true")
	}
	tr.add(1, "rw_acquire", []string{"w:V1", "id+1000+N+h"}, []int64{-1, 0, 5}, nil, at, at)
	tr.add(1, "rw_leave", []string{"id+1000+N+h"}, nil, failed, at, at)
	if !tr.leftInFault("N", "rw_leave") {
		t.Error("the latest call a failed leave: got false")
	}
	if tr.leftInFault("M", "rw_leave") {
		t.Error("a nonce no call named: got true")
	}
	tr.add(2, "rw_release", []string{"w:V2"}, []int64{1, 1}, nil, at, at)
	tr.add(2, "rw_acquire", []string{"w:V3"}, []int64{1, 4, 0}, nil, at, at)
	tr.add(2, "rw_acquire", []string{"w:V4"}, []int64{1, 5, 0}, nil, at, at) // the ring wraps: the first call is gone
	if !tr.leftInFault("N", "rw_leave") {
		t.Error("after the ring wrapped: got false")
	}
	tr.add(1, "rw_leave", []string{"id+1000+N+h"}, []int64{1, 0}, nil, at, at)
	if tr.leftInFault("N", "rw_leave") {
		t.Error("the latest call a leave that succeeded: got true")
	}
	tr.add(1, "rw_acquire", []string{"w:V5", "id+1000+N+h"}, []int64{1, 6, 0}, nil, at, at)
	tr.add(1, "rw_leave", []string{"id+1000+N+h"}, nil, failed, at, at)
	tr.add(1, "rw_acquire", []string{"w:V6", "id+1000+N+h"}, nil, failed, at, at)
	if tr.leftInFault("N", "rw_leave") {
		t.Error("the latest call a failed acquire: got true")
	}
}
