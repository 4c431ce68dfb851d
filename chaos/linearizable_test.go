package chaos

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A fencedOp is one call to a fencedResource as a client saw it: what it
// asked, what it was answered, and when the call began and returned.
type fencedOp struct {
	hold      int // the hold that called
	write     bool
	token     uint64 // a write's token
	call, ret time.Time
	accepted  bool        // a write's answer
	value     fencedValue // a read's answer
}

// A fencedValue is what a fencedResource holds: the last write it
// accepted, by hold with token; the zero value before any (a token is
// never 0).
type fencedValue struct {
	hold  int
	token uint64
}

// fencedRegister is porcupine's model of a fencedResource, a register
// fenced as fencing asks of a resource: a write with a token is
// accepted iff the token is at least the highest accepted so far (the
// token of the value it holds), and then holds the write; a read returns
// the last accepted write.
var fencedRegister = porcupine.Model{
	Init: func() any { return fencedValue{} },
	Step: func(state, input, output any) (bool, any) {
		v, op := state.(fencedValue), input.(fencedOp)
		if !op.write {
			return output.(fencedOp).value == v, v
		}
		ok := op.token >= v.token
		if output.(fencedOp).accepted != ok {
			return false, v
		}
		if ok {
			v = fencedValue{hold: op.hold, token: op.token}
		}
		return true, v
	},
	DescribeOperation: func(input, output any) string {
		if op := input.(fencedOp); op.write {
			return fmt.Sprintf("hold %d: write(%d) -> %v", op.hold, op.token, output.(fencedOp).accepted)
		}
		return fmt.Sprintf("read() -> %+v", output.(fencedOp).value)
	},
}

// linearizeTimeout bounds porcupine's search of one history. A history of
// a lock's resource is nearly sequential (two calls overlap only when a
// holder that lost its hold writes with its stale token as the next
// writes), which porcupine checks in about linear time; past the bound,
// the result is Unknown, and reported as such.
const linearizeTimeout = 2 * time.Minute

// checkLinearizable checks the calls to a fenced resource (ops) for
// linearizability against fencedRegister, with porcupine. It returns
// porcupine's result (Ok, Illegal, or Unknown if it timed out) and a
// violation if the history is not linearizable.
func checkLinearizable(what string, ops []fencedOp) (porcupine.CheckResult, []string) {
	if len(ops) == 0 {
		return porcupine.Ok, nil
	}
	base := ops[0].call
	history := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		history[i] = porcupine.Operation{ClientId: op.hold, Input: op, Call: op.call.Sub(base).Nanoseconds(), Output: op, Return: op.ret.Sub(base).Nanoseconds()}
	}
	result := porcupine.CheckOperationsTimeout(fencedRegister, history, linearizeTimeout)
	if result == porcupine.Illegal {
		return result, []string{fmt.Sprintf("%s: the history of %d calls to the fenced resource is not linearizable as a fenced register", what, len(ops))}
	}
	return result, nil
}

// TestCheckLinearizable feeds checkLinearizable a good history and
// histories that a fenced register cannot give, so that the check is
// known to bite.
func TestCheckLinearizable(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	write := func(hold int, token uint64, call, ret int, accepted bool) fencedOp {
		return fencedOp{hold: hold, write: true, token: token, call: at(call), ret: at(ret), accepted: accepted}
	}
	read := func(hold, call, ret int, vhold int, vtoken uint64) fencedOp {
		return fencedOp{hold: hold, call: at(call), ret: at(ret), value: fencedValue{vhold, vtoken}}
	}
	tests := []struct {
		name string
		ops  []fencedOp
		want porcupine.CheckResult
	}{
		{"sequential", []fencedOp{read(0, 0, 1, 0, 0), write(0, 1, 2, 3, true), read(1, 4, 5, 0, 1), write(1, 2, 6, 7, true), write(0, 1, 8, 9, false), read(2, 10, 11, 1, 2)}, porcupine.Ok},
		{"stale write concurrent with a fresh one", []fencedOp{write(0, 2, 0, 10, true), write(1, 1, 0, 10, true)}, porcupine.Ok},
		{"stale write accepted", []fencedOp{write(0, 2, 0, 1, true), write(1, 1, 2, 3, true)}, porcupine.Illegal},
		{"fresh write rejected", []fencedOp{write(0, 1, 0, 1, true), write(1, 2, 2, 3, false)}, porcupine.Illegal},
		{"read of a write not yet made", []fencedOp{read(0, 0, 1, 1, 5), write(1, 5, 2, 3, true)}, porcupine.Illegal},
		{"read of an overwritten value", []fencedOp{write(0, 1, 0, 1, true), write(1, 2, 2, 3, true), read(2, 4, 5, 0, 1)}, porcupine.Illegal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, violations := checkLinearizable("test", tt.ops)
			if got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			if (got == porcupine.Illegal) != (len(violations) == 1 && strings.Contains(violations[0], "not linearizable")) {
				t.Errorf("result %v with violations %q", got, violations)
			}
		})
	}
}

// rwOps returns the calls to an RW lock's resource as fencedOps: its
// writes, and the reads of the read sections (by their client), each at
// the moment the resource's mutex gave it (the resource takes the time
// under it).
func rwOps(r *rwResource, reads []readRecord) []fencedOp {
	var ops []fencedOp
	for i, w := range r.writes {
		ops = append(ops, fencedOp{hold: w.hold, write: true, token: w.token, call: r.at[i], ret: r.at[i], accepted: w.accepted})
	}
	value := func(write int) fencedValue {
		if write < 0 {
			return fencedValue{}
		}
		return fencedValue{hold: r.writes[write].hold, token: r.writes[write].token}
	}
	for _, rd := range reads {
		for _, read := range []struct {
			write int
			at    time.Time
		}{{rd.first, rd.firstAt}, {rd.second, rd.secondAt}} {
			if !read.at.IsZero() {
				ops = append(ops, fencedOp{hold: rd.client, call: read.at, ret: read.at, value: value(read.write)})
			}
		}
	}
	slices.SortFunc(ops, func(a, b fencedOp) int { return a.call.Compare(b.call) })
	return ops
}
