package netlock

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// A nodeView is what one node says of the election: who leads there, as
// far as we know.
type nodeView struct {
	known     bool // read or told at least once
	leads     bool
	term, rev uint64
	value     string
	until     time.Time // leads: when the lock expires unless extended (local clock)
}

// order returns v's place in the node's history: a term's values in the
// order of their revisions, then the term's end.
func (v nodeView) order() (uint64, uint64) {
	if !v.leads {
		return v.term, math.MaxUint64
	}
	return v.term, v.rev
}

// newer reports whether v comes after o in the node's history.
func (v nodeView) newer(o nodeView) bool {
	vt, vr := v.order()
	ot, or := o.order()
	return !o.known || vt > ot || (vt == ot && vr > or)
}

// read reads the nodes selected by targets (all when nil) into views, and
// reports which answered, and the errors of those that did not. A read
// replaces what was known of a node: it is the node's state when it ran,
// after every message it published before.
func (e *Election) read(ctx context.Context, views []nodeView, targets []bool) (answered []bool, errs []error) {
	replies := e.m.fanout(ctx, electReadScript, []string{e.keys.Lock, e.keys.Leader}, nil, targets)
	now := e.m.clk.Now()
	answered = make([]bool, len(replies))
	for i, r := range replies {
		if targets != nil && !targets[i] {
			continue
		}
		if r.err == nil {
			v, err := readView(r.vals, now)
			if err == nil {
				if !v.leads && views[i].term > v.term {
					v.term = views[i].term // the record expired: the term we knew ended
				}
				views[i], answered[i] = v, true
				continue
			}
			r.err = nodeError(i, err)
		}
		errs = append(errs, r.err)
	}
	return answered, errs
}

// readView reads lua/elect_read.lua's reply, read at now.
func readView(vals []int64, now time.Time) (nodeView, error) {
	if len(vals) < 5 {
		return nodeView{}, fmt.Errorf("elect_read script: unexpected reply %v", vals)
	}
	v := nodeView{known: true, leads: vals[0] == 1, term: uint64(vals[1]), rev: uint64(vals[2])}
	if !v.leads {
		return v, nil
	}
	v.until = now.Add(time.Duration(vals[3]) * time.Millisecond)
	value, ok := unpackAll(vals[4:])
	if !ok {
		return nodeView{}, fmt.Errorf("elect_read script: value of %d bytes in %d integers", vals[4], len(vals)-5)
	}
	v.value = value
	return v, nil
}

// parseChange reads a message of p{name}:elect:changes (see
// lua/elect_proclaim.lua and lua/release.lua), received at now.
func parseChange(payload string, now time.Time) (nodeView, bool) {
	kind, rest, _ := strings.Cut(payload, ":")
	switch kind {
	case "n":
		term, err := strconv.ParseUint(rest, 10, 64)
		return nodeView{known: true, term: term}, err == nil
	case "l":
		parts := strings.SplitN(rest, ":", 4)
		if len(parts) != 4 {
			return nodeView{}, false
		}
		term, err1 := strconv.ParseUint(parts[0], 10, 64)
		rev, err2 := strconv.ParseUint(parts[1], 10, 64)
		pttl, err3 := strconv.ParseInt(parts[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nodeView{}, false
		}
		return nodeView{known: true, leads: true, term: term, rev: rev, value: parts[3], until: now.Add(time.Duration(pttl) * time.Millisecond)}, true
	}
	return nodeView{}, false
}

// A verdict is what the nodes' views say of who leads.
type verdict int

// majority returns the leader a quorum of views agrees on: a term led on
// at least quorum nodes (two terms cannot both be), with the latest value
// (the highest revision) any of those nodes recorded. The value of a
// Proclaim that succeeded is on a quorum, which meets every quorum of
// nodes: it, or a later one, is found. Without such a term, it tells
// nobody from unknown: a view not known may be of a node that would make a
// quorum.
func majority(views []nodeView, quorum int) (Leader, verdict) {
	unheard := 0
	for _, v := range views {
		if !v.known {
			unheard++
		}
	}
	result := nobody
	if unheard >= quorum {
		result = unknown
	}
	for _, v := range views {
		if !v.leads {
			continue
		}
		on, latest := 0, v
		for _, o := range views {
			if o.leads && o.term == v.term {
				on++
				if o.rev > latest.rev {
					latest = o
				}
			}
		}
		if on >= quorum {
			return Leader{Value: latest.value, Term: v.term}, leads
		}
		if on+unheard >= quorum {
			result = unknown
		}
	}
	return Leader{}, result
}

const (
	leads   verdict = iota // a term is led on a quorum
	nobody                 // no term is, nor could be with the nodes not heard from
	unknown                // a term could be led on a quorum with the nodes not heard from
)
