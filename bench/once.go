package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
)

// The Once scenario (once): what a Do of a name done costs, the path every
// caller takes once the job ran; and a migration-style stampede,
// onceStampede processes calling Do on one fresh name at once, one of
// which runs the job while the others wait for it.
const (
	onceID       = "once"
	onceStampede = 50                    // clients, each its own connections, as processes
	onceJob      = 10 * time.Millisecond // the stampede's job (a short migration)
)

// A onceResult is what a row of the once scenario measures besides a
// result's: the result's ops, lat and elapsed are the Do calls of a name
// done.
type onceResult struct {
	doneCommands, doneScripts int64   // INFO commandstats over the Do calls of a name done, PINGs and bench's INFO left out
	stampedes                 int64   // stampedes finished
	runs                      int64   // the job's runs over them: one each
	early                     int64   // callers that returned before the run had ended: none
	after                     []int64 // per stampede, ns from the job's end to the last caller's return
	commands, scripts         int64   // INFO commandstats over the stampedes
}

func (a *onceResult) add(b *onceResult) {
	a.doneCommands += b.doneCommands
	a.doneScripts += b.doneScripts
	a.stampedes += b.stampedes
	a.runs += b.runs
	a.early += b.early
	a.after = append(a.after, b.after...)
	a.commands += b.commands
	a.scripts += b.scripts
}

func onceScenario() scenario {
	return scenario{
		id: onceID, title: fmt.Sprintf("15. Once: a Do of a name done, and a stampede of %d processes on one name", onceStampede),
		what: fmt.Sprintf("Each round gives half its time to each part. Done: one client, one goroutine, calling Do on a name whose job already ran (the path of every caller after the first run, and of a cron tick's late replicas) in a loop: calls/s, latency per call, and what Redis ran per call (`INFO commandstats` around the loop: commands, the commands scripts call included, the client library's keepalive PINGs and bench's own INFO left out; scripts: the EVALSHA and EVAL calls, the round trips). "+
			"Stampede: %d clients, each its own client object and connections (like pods starting at once), call Do on one fresh name together, the job a %v sleep, one stampede after another: stampedes measured, the job's runs per stampede (must be 1), the time from the job's end to the last caller's return (the runner records and releases, then each waiter in turn reads the record and passes the lock on), p50/p99 over the stampedes, and what Redis ran per caller. "+
			"Early: callers that returned before the job had ended (must be 0); a second run or an early return fails the run after its report is written.", onceStampede, onceJob),
		shape:  shapeOnce,
		strict: true,
	}
}

// onceRows are the rows of the once scenario for one netlock contender.
func onceRows(c *contender, addr string) []*row {
	name := rwRowName("Once", c.name)
	return []*row{{name: name, c: c, note: "netlock.NewOnce per name and client, default options", setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		probe, cls, cleanup, err := probeAndConnect(c, addr, onceStampede)
		if err != nil {
			return nil, nil, err
		}
		backends := make([][]netlock.Backend, len(cls))
		for i, cl := range cls {
			nc, ok := cl.(*netlockClient)
			if !ok {
				cleanup()
				return nil, nil, fmt.Errorf("%s is not netlock", c.name)
			}
			backends[i] = nc.backends
		}
		return func(ctx context.Context, dur time.Duration, round int) result {
			res := onceDone(ctx, probe, backends[0], lockName(onceID, name, round, -1), dur/2)
			res.once.add(onceStampedes(ctx, probe, backends, name, round, dur-dur/2, &res))
			res.overlaps += res.once.early + res.once.runs - res.once.stampedes
			return res
		}, cleanup, nil
	}}}
}

// commandsSince returns the commands and scripts Redis ran since before,
// PINGs and bench's INFO left out.
func commandsSince(probe redis.Conn, before commandStats) (commands, scripts int64, err error) {
	after, err := readCommandStats(probe)
	if err != nil {
		return 0, 0, err
	}
	n, _ := after.since(before)
	delta := func(cmd string) int64 { return after.calls[cmd] - before.calls[cmd] }
	return n - delta("ping"), delta("evalsha") + delta("eval"), nil
}

// onceDone runs the done part: Do of lname, done first, in a loop for dur.
func onceDone(ctx context.Context, probe redis.Conn, backends []netlock.Backend, lname string, dur time.Duration) result {
	res := result{once: &onceResult{}}
	o, err := netlock.NewOnce(lname, backends)
	if err == nil {
		_, err = o.Do(ctx, func(context.Context) error { return nil })
	}
	before, serr := readCommandStats(probe)
	if err = errors.Join(err, serr); err != nil {
		res.addErr(err)
		return res
	}
	ran := errors.New("Do of a name done ran the job again")
	r := runOps(ctx, dur, []func(context.Context) error{func(ctx context.Context) error {
		again, err := o.Do(ctx, func(context.Context) error { return nil })
		if again {
			return ran
		}
		return err
	}})
	r.once = res.once
	var cerr error
	r.once.doneCommands, r.once.doneScripts, cerr = commandsSince(probe, before)
	r.addIfErr(cerr)
	return r
}

// onceStampedes runs stampedes for dur, each on a fresh name, and returns
// what they measured; errors go to res.
func onceStampedes(ctx context.Context, probe redis.Conn, backends [][]netlock.Backend, row string, round int, dur time.Duration, res *result) *onceResult {
	out := &onceResult{}
	before, err := readCommandStats(probe)
	if err != nil {
		res.addErr(err)
		return out
	}
	deadline := time.Now().Add(dur)
	for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
		if err := stampede(ctx, backends, lockName(onceID, row, round, i), out); err != nil {
			res.addErr(err)
		}
	}
	var cerr error
	out.commands, out.scripts, cerr = commandsSince(probe, before)
	res.addIfErr(cerr)
	return out
}

// stampede has every client Do lname at once, and adds what it measured
// to out: the runs, the early returns, and how long after the job's end
// the last caller returned.
func stampede(ctx context.Context, backends [][]netlock.Backend, lname string, out *onceResult) error {
	onces := make([]*netlock.Once, len(backends))
	for i, b := range backends {
		var err error
		if onces[i], err = netlock.NewOnce(lname, b); err != nil {
			return err
		}
	}
	var runs atomic.Int64
	var ended atomic.Int64 // the job's end, ns since start
	start := time.Now()
	returned := make([]int64, len(onces))
	errs := make([]error, len(onces))
	go1 := make(chan struct{})
	var wg sync.WaitGroup
	for i, o := range onces {
		wg.Go(func() {
			<-go1
			_, errs[i] = o.Do(ctx, func(context.Context) error {
				runs.Add(1)
				time.Sleep(onceJob)
				ended.Store(time.Since(start).Nanoseconds())
				return nil
			})
			returned[i] = time.Since(start).Nanoseconds()
		})
	}
	close(go1)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	end := ended.Load()
	for _, r := range returned {
		if r < end {
			out.early++
		}
	}
	out.stampedes++
	out.runs += runs.Load()
	out.after = append(out.after, slices.Max(returned)-end)
	return nil
}

// pctNs is the q-quantile of xs (ns), nearest rank, as result.pct; "–"
// without samples.
func pctNs(xs []int64, q float64) string {
	if len(xs) == 0 {
		return "–"
	}
	s := slices.Sorted(slices.Values(xs))
	i := min(max(int(q*float64(len(s))+0.5)-1, 0), len(s)-1)
	return fmtDur(time.Duration(s[i]))
}

func writeOnceTable(p printer, sc *scenario) {
	p("| contender | done: calls/s | p50 | p99 | commands per call | scripts per call | stampedes | runs per stampede | last return after the job, p50 | p99 | commands per caller | scripts per caller | errors | early | notes |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range sc.rows {
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | | | | | | | | | | | | | %s |\n", r.name, status, r.na)
			continue
		}
		res, o := &r.res, r.res.once
		if o == nil {
			p("| %s | not measured (see Errors) | | | | | | | | | | | %d | | %s |\n", rowName(r), res.errs, r.note)
			continue
		}
		per := func(n, of int64) string {
			if of == 0 {
				return "–"
			}
			return fmtRate(float64(n) / float64(of))
		}
		runs := per(o.runs, o.stampedes)
		if o.runs != o.stampedes || o.early > 0 {
			runs = "**FAILED** (" + runs + ")"
		}
		callers := o.stampedes * onceStampede
		p("| %s | %s | %s | %s | %s | %s | %d | %s | %s | %s | %s | %s | %d | %d | %s |\n", rowName(r), fmtRate(res.rate()), fmtPct(res, 0.50), fmtPct(res, 0.99),
			per(o.doneCommands, res.ops), per(o.doneScripts, res.ops), o.stampedes, runs, pctNs(o.after, 0.50), pctNs(o.after, 0.99),
			per(o.commands, callers), per(o.scripts, callers), res.errs, o.early, r.note)
	}
}
