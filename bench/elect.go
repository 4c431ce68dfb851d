package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/netlock-go/netlock"
)

// The election scenario (elect8): processes campaigning for one Election,
// each leader leading for the critical section of scenario 3 and resigning,
// then campaigning again; its hand-over against the same loop on a
// NetMutex, measured as scenario 3 measures a holder change.
const electProcesses = 8 // clients, each its own connections, as processes; one goroutine each

var electID = fmt.Sprintf("elect%d", electProcesses)

// electScenario returns the elect8 scenario, without rows.
func electScenario() scenario {
	return scenario{
		id: electID, title: fmt.Sprintf("14. Election hand-over: %d processes campaigning for one Election, against a NetMutex hand-over", electProcesses),
		what: fmt.Sprintf("%d clients, each its own client object and connections (like separate processes), one goroutine each. "+
			"Election rows: one *Election per process, all of one name; each loops Campaign(ctx, value) → the critical section of scenario 3 (a counter load and store) → Resign. "+
			"NetMutex rows, the comparison: one *NetMutex per process, all of one name, looping LockCtx → the same section → UnlockCtx (scenario 3's netlock rows, with the commands counted). "+
			"Hand-over: from Resign (UnlockCtx) returning in one process to Campaign (LockCtx) returning in a *different* process (negative when that Campaign returned first), p50/p99, as scenario 3's holder change; hand-overs/s: those hand-overs per second, × NetMutex's: against the NetMutex row of the same client. "+
			"Self-reacquire and fairness as in scenario 3. "+
			"Commands per hand-over: what Redis ran while the row ran (`INFO commandstats` around each round: the commands scripts call included, the client library's keepalive PINGs and bench's own INFO left out) ÷ the terms (holds) that began before the round's deadline, each one hand-over from the term before; "+
			"scripts per hand-over: the EVALSHA (and EVAL) calls among them. "+
			"Overlaps: entries into the section another process was in (two leaders at once); lost: counter updates lost to overlap; both must be 0, else the run exits with an error after writing its report.", electProcesses),
		shape:  shapeElect,
		strict: true,
	}
}

// electionLocker campaigns as a locker: lock is Campaign, its unlock Resign.
type electionLocker struct {
	e     *netlock.Election
	value string
}

func (l electionLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	if err := l.e.Campaign(ctx, l.value); err != nil {
		return nil, err
	}
	return l.e.Resign, nil
}

// electRows are the rows of the elect scenario for one netlock contender.
func electRows(c *contender, addr string) []*row {
	return []*row{
		electRow(c, addr, "Election", "one *Election per process: Campaign … Resign", func(name string, p int, b []netlock.Backend) (locker, error) {
			e, err := netlock.NewElection(name, b)
			return electionLocker{e, fmt.Sprintf("process %d", p)}, err
		}),
		electRow(c, addr, "NetMutex", "one *NetMutex per process: LockCtx … UnlockCtx", func(name string, _ int, b []netlock.Backend) (locker, error) {
			m, err := netlock.New(name, b)
			return netlockLocker{m}, err
		}),
	}
}

func electRow(c *contender, addr, kind, note string, newLocker func(name string, p int, b []netlock.Backend) (locker, error)) *row {
	name := rwRowName(kind, c.name)
	return &row{name: name, c: c, note: note, setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		probe, cls, cleanup, err := probeAndConnect(c, addr, electProcesses)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, dur time.Duration, round int) result {
			lname := lockName(electID, name, round, 0)
			lockers, err := makeLockers(len(cls), func(p int) (locker, error) {
				nc, ok := cls[p].(*netlockClient)
				if !ok {
					return nil, fmt.Errorf("%s is not netlock", c.name)
				}
				return newLocker(lname, p, nc.backends)
			})
			var res result
			if err != nil {
				res.addErr(err)
				return res
			}
			before, err := readCommandStats(probe)
			if err != nil {
				res.addErr(err)
				return res
			}
			res = runContended(ctx, dur, lockers)
			after, err := readCommandStats(probe)
			if err != nil {
				res.addErr(err)
				return res
			}
			n, _ := after.since(before)
			delta := func(cmd string) int64 { return after.calls[cmd] - before.calls[cmd] }
			res.sem = &semStats{commands: n - delta("ping"), scripts: delta("evalsha") + delta("eval")}
			return res
		}, cleanup, nil
	}}
}

// handOversPerSecond is the hand-overs (holder changes) of r per second.
func handOversPerSecond(r *result) float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.changes) / r.elapsed.Seconds()
}

func writeElectTable(p printer, sc *scenario) {
	p("| contender | hand-overs/s | × NetMutex's | hand-over p50 | p99 | self-reacquire | fairness (min/max) | commands per hand-over | scripts per hand-over | gave up | errors | overlaps / lost | notes |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range sc.rows {
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | | | | | | | | | | | %s |\n", r.name, status, r.na)
			continue
		}
		res := &r.res
		if res.sem == nil {
			p("| %s | not measured (see Errors) | | | | | | | | %d | %d | %d / %d | %s |\n", rowName(r), res.busy, res.errs, res.overlaps, res.lost, r.note)
			continue
		}
		rate := fmtRate(handOversPerSecond(res))
		if res.overlaps+res.lost > 0 {
			rate = "**FAILED: two leaders at once** (" + rate + ")"
		}
		ratio := "–"
		if b := electBase(sc, r); b != nil && handOversPerSecond(&b.res) > 0 {
			ratio = fmt.Sprintf("%.2f×", handOversPerSecond(res)/handOversPerSecond(&b.res))
		}
		self := "–"
		if v, ok := res.selfPct(); ok {
			self = fmt.Sprintf("%.1f%%", v)
		}
		fair, lo, hi := res.fairness()
		per := func(n int64) string {
			if res.ops == 0 {
				return "–"
			}
			return fmtRate(float64(n) / float64(res.ops))
		}
		p("| %s | %s | %s | %s | %s | %s | %.2f (%d/%d) | %s | %s | %d | %d | %d / %d | %s |\n", rowName(r), rate, ratio,
			fmtPct(res, 0.50), fmtPct(res, 0.99), self, fair, lo, hi, per(res.sem.commands), per(res.sem.scripts), res.busy, res.errs, res.overlaps, res.lost, r.note)
	}
}

// electBase is the NetMutex row of an Election row (same client), nil if
// there is none or it has no figures.
func electBase(sc *scenario, r *row) *row {
	if !strings.HasPrefix(r.name, "Election/") {
		return nil
	}
	for _, b := range sc.rows {
		if b.c == r.c && strings.HasPrefix(b.name, "NetMutex/") {
			if _, ok := rowStatus(b); ok && b.res.sem != nil {
				return b
			}
		}
	}
	return nil
}
