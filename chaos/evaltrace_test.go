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
	start time.Time

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
	start, end time.Duration // since the trace began
}

func newEvalTrace() *evalTrace {
	return &evalTrace{start: time.Now(), calls: make([]traceCall, traceSize)}
}

// add records one call of client's.
func (t *evalTrace) add(client int, script string, args []string, vals []int64, err error, start, end time.Time) {
	reply := fmt.Sprint(vals)
	if err != nil {
		reply = "error: " + err.Error()
	}
	c := traceCall{client: client, script: script, args: strings.Join(args, " "), reply: reply, start: start.Sub(t.start), end: end.Sub(t.start)}
	t.mu.Lock()
	t.calls[t.next] = c
	t.next = (t.next + 1) % len(t.calls)
	t.full = t.full || t.next == 0
	t.mu.Unlock()
}

// about returns the recorded calls whose arguments contain s, oldest first,
// one per line, and the time of the latest recorded call.
func (t *evalTrace) about(s string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	n := t.next
	if t.full {
		n = len(t.calls)
	}
	for i := range n {
		c := t.calls[i]
		if t.full {
			c = t.calls[(t.next+i)%len(t.calls)]
		}
		if strings.Contains(c.args, s) {
			fmt.Fprintf(&b, "  %v–%v client %d %s %s → %s\n", c.start.Round(time.Microsecond), c.end.Round(time.Microsecond), c.client, c.script, c.args, c.reply)
		}
	}
	return b.String()
}
