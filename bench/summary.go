package main

import (
	"fmt"
	"strings"
)

// The targets netlock holds itself to, each computed from this run's rows.

var netlockRows = []string{"netlock/redigo", "netlock/goredis", "netlock/rueidis"}

// client is the client library a netlock row uses: its floor rows carry the
// same suffix.
func clientOf(netlockRow string) string { return netlockRow[strings.IndexByte(netlockRow, '/')+1:] }

type target struct {
	what      string
	threshold string
	// value gives netlock's figure for one netlock row (ok false if it or
	// its reference was not measured) and whether it meets the threshold.
	value func(nl string) (v string, met, ok bool)
	// ref says what the figure is compared with.
	ref func() string
}

func writeSummary(p printer, scs []*scenario) {
	byID := map[string]*scenario{}
	for _, sc := range scs {
		byID[sc.id] = sc
	}
	get := func(id, name string) *result {
		sc := byID[id]
		if sc == nil {
			return nil
		}
		for _, r := range sc.rows {
			if r.name == name && r.na == "" && r.setupErr == nil && r.res.ran {
				return &r.res
			}
		}
		return nil
	}
	// best is the fastest peer row of a scenario that passes keep.
	best := func(id string, keep func(*result) bool) (string, *result) {
		var name string
		var res *result
		if sc := byID[id]; sc != nil {
			for _, r := range sc.rows {
				if r.c == nil || r.c.role != rolePeer || r.na != "" || r.setupErr != nil || !r.res.ran || (keep != nil && !keep(&r.res)) {
					continue
				}
				if res == nil || r.res.rate() > res.rate() {
					name, res = r.name, &r.res
				}
			}
		}
		return name, res
	}
	fair := func(r *result) bool {
		s, ok := r.selfPct()
		f, _, _ := r.fairness()
		return ok && s <= 50 && f >= 0.5
	}
	bestRef := func(id string, keep func(*result) bool, unit string) func() string {
		return func() string {
			name, res := best(id, keep)
			if res == nil {
				return "no peer measured"
			}
			return fmt.Sprintf("%s, %s %s", name, fmtRate(res.rate()), unit)
		}
	}
	rateVsBest := func(id string, keep func(*result) bool, min float64) func(string) (string, bool, bool) {
		return func(nl string) (string, bool, bool) {
			r := get(id, nl)
			_, peer := best(id, keep)
			if r == nil || peer == nil || peer.rate() == 0 {
				return "", false, false
			}
			x := r.rate() / peer.rate()
			return fmt.Sprintf("%.2f× (%s/s)", x, fmtRate(r.rate())), x >= min, true
		}
	}
	// waitingValue and waitingRef give a figure of the waiting scenario
	// (at most 1 per waiter-second), netlock's and the lowest peer's.
	waitingValue := func(figure func(*waitResult) float64) func(string) (string, bool, bool) {
		return func(nl string) (string, bool, bool) {
			r := get(waitingID, nl)
			if r == nil || r.wait == nil {
				return "", false, false
			}
			v := figure(r.wait)
			return fmtRate(v), v <= 1, true
		}
	}
	waitingRef := func(figure func(*waitResult) float64) func() string {
		return func() string {
			sc := byID[waitingID]
			if sc == nil {
				return "no peer measured"
			}
			low, name := lowestWaiting(sc, func(r *row) bool { return r.c.role == rolePeer }, figure)
			if low == nil {
				return "no peer measured"
			}
			return fmt.Sprintf("lowest peer: %s, %s", name, fmtRate(figure(low)))
		}
	}
	p50Ratio := func(id, refID, refPrefix string, max float64) func(string) (string, bool, bool) {
		return func(nl string) (string, bool, bool) {
			r, ref := get(id, nl), get(refID, refPrefix+clientOf(nl))
			if r == nil || ref == nil {
				return "", false, false
			}
			a, ok1 := r.pct(0.5)
			b, ok2 := ref.pct(0.5)
			if !ok1 || !ok2 || b <= 0 {
				return "", false, false
			}
			x := float64(a) / float64(b)
			v := fmt.Sprintf("%.2f× (%s vs %s)", x, fmtDur(a), fmtDur(b))
			if a < 0 {
				v += ", negative: the next holder's lock mostly returned before the old holder's unlock did"
			}
			return v, x <= max, true
		}
	}
	p50Refs := func(id, prefix string) func() string {
		return func() string {
			var parts []string
			for _, nl := range netlockRows {
				name := prefix + clientOf(nl)
				if r := get(id, name); r != nil {
					d, _ := r.pct(0.5)
					parts = append(parts, fmt.Sprintf("%s %s", name, fmtDur(d)))
				}
			}
			if len(parts) == 0 {
				return "not measured"
			}
			return "p50: " + strings.Join(parts, ", ")
		}
	}

	// costVsHand gives a per-operation cost of the uncontended scenario,
	// netlock's and the hand-written cycle's on the same client.
	costVsHand := func(figure func(*result) (float64, bool)) func(string) (string, bool, bool) {
		return func(nl string) (string, bool, bool) {
			r, h := get("uncontended", nl), get("uncontended", "hand-written/"+clientOf(nl))
			if r == nil || h == nil {
				return "", false, false
			}
			a, ok1 := figure(r)
			b, ok2 := figure(h)
			if !ok1 || !ok2 {
				return "", false, false
			}
			return fmt.Sprintf("%s (hand-written %s)", fmtCost(a, true), fmtCost(b, true)), true, true
		}
	}
	// holdsValue gives a count of the holds scenario, met when it is at
	// most most.
	holdsValue := func(figure func(*holdsResult) int64, most int64) func(string) (string, bool, bool) {
		return func(nl string) (string, bool, bool) {
			r := get(holdsID, nl)
			if r == nil || r.holds == nil {
				return "", false, false
			}
			v := figure(r.holds)
			return fmt.Sprint(v), v <= most, true
		}
	}
	// rwReadValue: reads/s of NetRWMutex ÷ NetMutex's in the read-mostly
	// scenario, same client.
	rwReadValue := func(nl string) (string, bool, bool) {
		r, b := get(rwReadID, rwRowName("NetRWMutex", nl)), get(rwReadID, rwRowName("NetMutex", nl))
		if r == nil || b == nil || r.rw == nil || b.readRate() == 0 {
			return "", false, false
		}
		x := r.readRate() / b.readRate()
		v := fmt.Sprintf("%.2f× (%s vs %s reads/s)", x, fmtRate(r.readRate()), fmtRate(b.readRate()))
		if r.overlaps > 0 || r.lost > 0 {
			return v + ", FAILED: exclusion violated", false, true
		}
		return v, x >= rwTarget(), true
	}
	// rwWaitingValue: the waiting cost of NetRWMutex's readers or writers,
	// without the client library's keepalive PINGs.
	rwWaitingValue := func(kind string) func(string) (string, bool, bool) {
		return func(nl string) (string, bool, bool) {
			r := get(rwWaitingID, rwRowName(kind, nl))
			if r == nil || r.wait == nil {
				return "", false, false
			}
			v := r.wait.lockPerWaiterSecond()
			return fmt.Sprintf("%s (%s with PINGs)", fmtRate(v), fmtRate(r.wait.perWaiterSecond())), v <= 1 && r.overlaps == 0, true
		}
	}
	targets := []target{
		{
			what: "uncontended ops/s ÷ fastest peer", threshold: "≥ 1.00",
			value: rateVsBest("uncontended", nil, 1), ref: bestRef("uncontended", nil, "ops/s"),
		},
		{
			what: "uncontended p50 ÷ hand-written cycle p50, same client (same scenario)", threshold: "≤ 1.15",
			value: p50Ratio("uncontended", "uncontended", "hand-written/", 1.15), ref: p50Refs("uncontended", "hand-written/"),
		},
		{
			what: "uncontended: server µs per lock+unlock (`INFO commandstats`), next to the hand-written cycle's, same client", threshold: "–",
			value: costVsHand((*result).serverPerOp), ref: func() string { return "" },
		},
		{
			what: "uncontended: allocations per lock+unlock (the harness's included), next to the hand-written cycle's, same client", threshold: "–",
			value: costVsHand((*result).allocsPerOp), ref: func() string { return "" },
		},
		{
			what: "8 clients: CS/s ÷ fastest peer", threshold: "≥ 1.00",
			value: rateVsBest("clients8", nil, 1), ref: bestRef("clients8", nil, "CS/s"),
		},
		{
			what: "8 clients: self-reacquire", threshold: "≤ 50%",
			value: func(nl string) (string, bool, bool) {
				r := get("clients8", nl)
				if r == nil {
					return "", false, false
				}
				s, ok := r.selfPct()
				return fmt.Sprintf("%.1f%%", s), s <= 50, ok
			},
			ref: func() string { return "" },
		},
		{
			what: "8 clients: fairness, min/max acquisitions per client", threshold: "≥ 0.50",
			value: func(nl string) (string, bool, bool) {
				r := get("clients8", nl)
				if r == nil {
					return "", false, false
				}
				f, lo, hi := r.fairness()
				return fmt.Sprintf("%.2f (%d/%d)", f, lo, hi), f >= 0.5, true
			},
			ref: func() string { return "" },
		},
		{
			what: "8 clients: holder-change p50 ÷ PING p50, same client (floor scenario)", threshold: "≤ 3.00",
			value: p50Ratio("clients8", "floor", "PING/", 3), ref: p50Refs("floor", "PING/"),
		},
		{
			what: "8 goroutines sharing one lock object: CS/s ÷ fastest peer", threshold: "≥ 10.00",
			value: rateVsBest("shared8", nil, 10), ref: bestRef("shared8", nil, "CS/s"),
		},
		{
			what: "independent keys, 64 goroutines: ops/s ÷ fastest peer", threshold: "≥ 2.00",
			value: rateVsBest("keys64", nil, 2), ref: bestRef("keys64", nil, "ops/s"),
		},
		{
			what: fmt.Sprintf("quorum of %d: ops/s ÷ fastest peer", quorumServers), threshold: "≥ 1.50",
			value: rateVsBest(fmt.Sprintf("quorum%d", quorumServers), nil, 1.5), ref: bestRef(fmt.Sprintf("quorum%d", quorumServers), nil, "ops/s"),
		},
		{
			what: fmt.Sprintf("%d waiters behind a holder: Redis commands per waiter-second", waitingClients), threshold: "≤ 1.00",
			value: waitingValue((*waitResult).perWaiterSecond), ref: waitingRef((*waitResult).perWaiterSecond),
		},
		{
			what: "the same, without the PINGs a client library sends by itself (rueidis: one per idle connection per second)", threshold: "≤ 1.00",
			value: waitingValue((*waitResult).lockPerWaiterSecond), ref: waitingRef((*waitResult).lockPerWaiterSecond),
		},
		{
			what: fmt.Sprintf("%d holds in one process: holds lost", manyHolds), threshold: "0",
			value: holdsValue(func(h *holdsResult) int64 { return h.lost }, 0), ref: func() string { return "" },
		},
		{
			what: fmt.Sprintf("%d holds in one process: peak server connections", manyHolds), threshold: "≤ 256",
			value: holdsValue(func(h *holdsResult) int64 { return int64(h.peakConns) }, 256), ref: func() string { return "" },
		},
		{
			what: fmt.Sprintf("read-mostly, %d processes × %d goroutines, %.0f%% reads, %v sections: reads/s of NetRWMutex ÷ NetMutex's, same client", rwProcesses, rwGoroutines, 100*rwReadShare, rwSection), threshold: fmt.Sprintf("≥ %.2f", rwTarget()),
			value: rwReadValue, ref: func() string { return "NetMutex taken with LockCtx for reads and writes alike (same run)" },
		},
		{
			what: fmt.Sprintf("NetRWMutex, %d readers waiting behind a writer: Redis commands per waiter-second, without the client's keepalive PINGs", waitingClients), threshold: "≤ 1.00",
			value: rwWaitingValue("NetRWMutex readers"), ref: func() string { return "" },
		},
		{
			what: fmt.Sprintf("NetRWMutex, %d writers waiting behind a reader: the same", waitingClients), threshold: "≤ 1.00",
			value: rwWaitingValue("NetRWMutex writers"), ref: func() string { return "" },
		},
		{
			what: "for reference: 8 clients CS/s ÷ fastest *fair* peer (self-reacquire ≤ 50% and fairness ≥ 0.5)", threshold: "–",
			value: func(nl string) (string, bool, bool) {
				v, _, ok := rateVsBest("clients8", fair, 0)(nl)
				return v, true, ok
			},
			ref: bestRef("clients8", fair, "CS/s"),
		},
	}

	p("## Summary: netlock against its targets\n\n")
	p("Each figure is netlock's, as a ratio to a row measured in this same run (the waiting cost: as measured, next to the lowest peer's).\n\n")
	p("| target | threshold | %s | compared with |\n|---|---|%s---|\n", strings.Join(netlockRows, " | "), strings.Repeat("---|", len(netlockRows)))
	for _, t := range targets {
		cells := make([]string, len(netlockRows))
		for i, nl := range netlockRows {
			v, met, ok := t.value(nl)
			switch {
			case !ok:
				cells[i] = "not measured"
			case t.threshold == "–":
				cells[i] = v
			case met:
				cells[i] = v + " — met"
			default:
				cells[i] = v + " — **not met**"
			}
		}
		p("| %s | %s | %s | %s |\n", t.what, t.threshold, strings.Join(cells, " | "), t.ref())
	}

	var overlaps, lost, errs, setupErrs int64
	for _, sc := range scs {
		for _, r := range sc.rows {
			overlaps += r.res.overlaps
			lost += r.res.lost
			errs += r.res.errs
			if r.setupErr != nil {
				setupErrs++
			}
		}
	}
	p("\nCorrectness guards over every row of every scenario: %d overlapping critical sections, %d lost counter updates, %d errors, %d failed setups (details under Errors).\n\n",
		overlaps, lost, errs, setupErrs)
}
