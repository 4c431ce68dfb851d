package chaos

import (
	"fmt"
	"strings"
	"sync"
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
