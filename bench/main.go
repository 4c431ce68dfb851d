// Command bench measures netlock side by side with other Go Redis lock
// libraries and writes the tables to RESULTS.md.
//
//	cd bench && go run .                       # every scenario, about 10 minutes
//	cd bench && go run . -duration 1s -only 'clients8|netlock'
//	cd bench && go run . -only waiting40 -out -   # the waiting scenario only, about 2 minutes
//	cd bench && go run . -only holds10k -out -    # 10,000 holds, about 3 minutes
//	cd bench && go run . -only rwread -out -      # NetRWMutex against NetMutex, read-mostly, about 20 s
//	cd bench && go run . -only rwwaiting40 -out - # NetRWMutex's waiting cost, about 1 minute
//	cd bench && go run . -only sem4 -out -        # Semaphore against 4 NetMutex names, about 20 s
//	cd bench && go run . -only semwaiting40 -out - # a full Semaphore's waiting cost, about 30 s
//	cd bench && go run . -only 'multi[24]' -out -  # MultiMutex against NetMutexes in sorted order, about 40 s
//	cd bench && go run . -only elect8 -out -       # Election hand-over against a NetMutex hand-over, about 20 s
//	cd bench && go run . -only once -out -         # Once: a Do of a name done, and stampedes of 50 processes, about 20 s
//
// It starts its own redis-server processes on free 127.0.0.1 ports (no
// persistence), stops them by pid when it ends, also on error or ^C, and
// measures the netlock checked out next to it (go.mod replaces the module
// with ../). Each row of a scenario runs for -duration in all, split into
// -rounds rounds; in every round each row runs once, in an order that turns
// from round to round, so that drift of a noisy machine falls on all rows
// alike. The waiting scenarios measure each row once, for -window; the
// holds scenario, for -holdfor. An overlap or a lost update in a scenario
// of netlock alone (NetRWMutex, Semaphore, MultiMutex, Election, Once) ends the run with an error, after
// the report is written.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"
)

type flags struct {
	duration time.Duration
	rounds   int
	warmup   time.Duration
	window   time.Duration
	holdFor  time.Duration
	out      string
	only     *regexp.Regexp
	note     string
	profile  string
}

func main() {
	var f flags
	var only string
	flag.DurationVar(&f.duration, "duration", 3*time.Second, "measured time per row of each scenario, split over -rounds")
	flag.IntVar(&f.rounds, "rounds", 3, "rounds per scenario: each row runs once per round, order rotating")
	flag.DurationVar(&f.warmup, "warmup", 200*time.Millisecond, "unmeasured run of each row before its first round")
	flag.DurationVar(&f.window, "window", lockExpiry, fmt.Sprintf("measured window of each row of the waiting scenario, after its %v warm-up", waitWarmup))
	flag.DurationVar(&f.holdFor, "holdfor", time.Minute, fmt.Sprintf("how long each row of the holds scenario holds its %d locks", manyHolds))
	flag.DurationVar(&rwSection, "rwsection", rwSection, fmt.Sprintf("critical section of the rwread scenario: a busy wait below %v, a sleep from it", rwSleepFrom))
	flag.StringVar(&f.out, "out", "RESULTS.md", "Markdown report to write (- for standard output)")
	flag.StringVar(&only, "only", "", "run only rows whose \"scenario/contender\" matches this regexp (scenarios: floor, uncontended, clients8, shared8, keys8, keys64, quorum5, waiting40, holds10k, rwread, rwwaiting40, sem4, semwaiting40, multi2, multi4, multi2slots, multi4slots, elect8, once)")
	flag.StringVar(&f.note, "note", "", "a line to put at the top of the report")
	flag.StringVar(&f.profile, "cpuprofile", "", "write a CPU profile of the whole run to this file (narrow it with -only)")
	flag.Parse()
	if flag.NArg() > 0 || f.duration <= 0 || f.rounds < 1 || f.warmup < 0 || f.window <= 0 || f.holdFor <= 0 || rwSection < 0 {
		flag.Usage()
		os.Exit(2)
	}
	if only != "" {
		var err error
		if f.only, err = regexp.Compile(only); err != nil {
			fmt.Fprintln(os.Stderr, "bench: -only:", err)
			os.Exit(2)
		}
	}
	if err := run(f); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(f flags) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if f.profile != "" {
		pf, err := os.Create(f.profile)
		if err != nil {
			return err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	started := time.Now()
	var servers []*server
	defer func() {
		for _, s := range servers {
			s.stop()
		}
		stopCluster()
	}()
	for range quorumServers {
		s, err := startServer()
		if err != nil {
			return err
		}
		servers = append(servers, s)
	}
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.addr
	}
	logf("%d redis-servers on %s", len(servers), strings.Join(addrs, ", "))

	scs := buildScenarios(contenders(), addrs)
	for _, sc := range scs {
		if ctx.Err() != nil {
			break
		}
		if err := runScenario(ctx, f, sc); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return errors.New("interrupted; no report written")
	}
	rep := report(f, scs, started, time.Since(started))
	if f.out == "-" {
		_, err := os.Stdout.WriteString(rep)
		return err
	}
	if err := os.WriteFile(f.out, []byte(rep), 0o644); err != nil {
		return err
	}
	logf("wrote %s (%v)", f.out, time.Since(started).Round(time.Second))
	if n := strictViolations.Load(); n > 0 {
		return fmt.Errorf("%d overlapping critical sections or lost updates in the scenarios of netlock alone (warm-ups included): netlock let in a holder it must exclude; see the report's Errors", n)
	}
	return nil
}

// strictViolations counts, over the whole run, warm-ups included, the
// overlaps and lost updates of the rows of strict scenarios.
var strictViolations atomic.Int64

// checkStrict counts the overlaps and lost updates of one run of a row of a
// strict scenario, and says so loudly.
func checkStrict(sc *scenario, r *row, res *result, round int) {
	if !sc.strict || res.overlaps+res.lost == 0 {
		return
	}
	strictViolations.Add(res.overlaps + res.lost)
	when := "warm-up"
	if round >= 0 {
		when = fmt.Sprintf("round %d", round+1)
	}
	logf("!!! %s/%s: EXCLUSION VIOLATED in the %s: %d overlapping sections, %d lost updates", sc.id, r.name, when, res.overlaps, res.lost)
}

// An active row is a row that was set up.
type active struct {
	r       *row
	phase   func(context.Context, time.Duration, int) result
	cleanup func()
}

// runScenario sets up every selected row of sc, warms each up, then runs the
// rounds, turning the order of the rows from round to round.
func runScenario(ctx context.Context, f flags, sc *scenario) error {
	rows := setUp(f, sc)
	defer func() {
		for _, a := range rows {
			a.cleanup()
		}
	}()
	if len(rows) == 0 {
		return nil
	}
	if sc.shape == shapeWaiting || sc.shape == shapeHolds {
		runOnce(ctx, f, sc, rows)
		return nil
	}
	var probe redis.Conn
	if sc.costOn != "" {
		var err error
		if probe, err = dialProbe(sc.costOn); err != nil {
			return fmt.Errorf("%s: %w", sc.id, err)
		}
		defer probe.Close()
	}
	logf("%s: %d rows × %v", sc.id, len(rows), f.duration)
	per := f.duration / time.Duration(f.rounds)
	if !warmUp(ctx, f, sc, rows) {
		return nil
	}
	for round := range f.rounds {
		off := round * len(rows) / f.rounds
		for i := range rows {
			j := (off + i) % len(rows)
			if round%2 == 1 {
				j = len(rows) - 1 - j
			}
			a := rows[j]
			runtime.GC() // no row pays for the garbage of the one before
			var c0 cost
			if probe != nil {
				var err error
				if c0, err = takeCost(probe); err != nil {
					return fmt.Errorf("%s: %w", sc.id, err)
				}
			}
			res := a.phase(ctx, per, round)
			if ctx.Err() != nil {
				return nil
			}
			if probe != nil {
				c1, err := takeCost(probe)
				if err != nil {
					return fmt.Errorf("%s: %w", sc.id, err)
				}
				res.costed = true
				res.serverUsec = c1.stats.usecSince(c0.stats)
				res.mallocs = c1.mallocs - c0.mallocs
			}
			a.r.res.merge(res)
			checkStrict(sc, a.r, &res, round)
			logRound(sc, f, a.r, round, &res)
		}
	}
	return nil
}

// setUp sets up the rows of sc that -only selects and returns them; a row
// whose setup failed is left out, its error kept in the row.
func setUp(f flags, sc *scenario) []active {
	var rows []active
	for _, r := range sc.rows {
		if r.na != "" || (f.only != nil && !f.only.MatchString(sc.id+"/"+r.name)) {
			continue
		}
		phase, cleanup, err := r.setup()
		if err != nil {
			r.setupErr = err
			logf("%s/%s: setup: %v", sc.id, r.name, err)
			continue
		}
		rows = append(rows, active{r, phase, cleanup})
	}
	return rows
}

// warmUp runs each row for -warmup, unmeasured, and reports whether ctx
// is still live.
func warmUp(ctx context.Context, f flags, sc *scenario, rows []active) bool {
	for _, a := range rows {
		if f.warmup > 0 {
			res := a.phase(ctx, f.warmup, -1)
			checkStrict(sc, a.r, &res, -1)
		}
		if ctx.Err() != nil {
			return false
		}
	}
	return true
}

// logRound tells on stderr what one round of row r measured.
func logRound(sc *scenario, f flags, r *row, round int, res *result) {
	switch {
	case sc.shape == shapeOnce && res.once != nil:
		o := res.once
		logf("  %s round %d/%d %-24s done: %s calls/s, %s scripts per call; %d stampedes, %d runs, last return p50 %s after the job; %d early, %d errors",
			sc.id, round+1, f.rounds, r.name, fmtRate(res.rate()), fmtRate(float64(o.doneScripts)/float64(max(res.ops, 1))), o.stampedes, o.runs, pctNs(o.after, 0.5), o.early, res.errs)
	case sc.shape == shapeElect:
		logf("  %s round %d/%d %-24s %s hand-overs/s, p50 %s p99 %s; %d overlaps, %d lost, %d errors",
			sc.id, round+1, f.rounds, r.name, fmtRate(handOversPerSecond(res)), fmtPct(res, 0.5), fmtPct(res, 0.99), res.overlaps, res.lost, res.errs)
	case res.sem != nil:
		logf("  %s round %d/%d %-24s %s acquisitions/s, wait p50 %s p99 %s; Jain's index %.3f (processes), %.3f (goroutines); %d overlaps, %d errors",
			sc.id, round+1, f.rounds, r.name, fmtRate(res.rate()), fmtPct(res, 0.5), fmtPct(res, 0.99), jain(res.perWorker), jain(res.sem.perGoroutine), res.overlaps, res.errs)
	case res.rw != nil:
		rw := res.rw
		logf("  %s round %d/%d %-24s %s reads/s, %s writes/s; %s commands, %s scripts per section; %d overlaps, %d lost writes, %d errors",
			sc.id, round+1, f.rounds, r.name, fmtRate(res.readRate()), fmtRate(res.writeRate()), rw.perOp(rw.commands), rw.perOp(rw.scripts), res.overlaps, res.lost, res.errs)
	default:
		logf("  %s round %d/%d %-24s %s/s", sc.id, round+1, f.rounds, r.name, fmtRate(res.rate()))
	}
}

// A cost is a snapshot of the server's command counters and of the
// process's heap allocations.
type cost struct {
	stats   commandStats
	mallocs uint64
}

func takeCost(probe redis.Conn) (cost, error) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s, err := readCommandStats(probe)
	return cost{s, ms.Mallocs}, err
}

// runOnce runs each row once, in order: a row of the waiting scenario (for
// the window) or of the holds scenario (for -holdfor) measures the whole
// server, so rows cannot overlap, and it brings its own warm-up.
func runOnce(ctx context.Context, f flags, sc *scenario, rows []active) {
	dur := f.window
	if sc.shape == shapeHolds {
		dur = f.holdFor
		logf("%s: %d rows × %d holds for %v", sc.id, len(rows), manyHolds, dur)
	} else {
		logf("%s: %d rows × (%v warm-up + %v)", sc.id, len(rows), waitWarmup, dur)
	}
	for _, a := range rows {
		runtime.GC()
		start := time.Now()
		res := a.phase(ctx, dur, 0)
		if ctx.Err() != nil {
			return
		}
		a.r.res.merge(res)
		checkStrict(sc, a.r, &res, 0)
		if h := res.holds; h != nil {
			logf("  %s %-24s acquired in %v; %d lost, %d keys gone; peak %d server connections, %d goroutines; %s extends/s (holds/(expiry/3) = %s); CPU %s; %d errors; took %v",
				sc.id, a.r.name, h.acquireTook.Round(time.Millisecond), h.lost, h.gone, h.peakConns, h.peakRoutine, fmtRate(h.extendsPerSecond()), fmtRate(h.wantExtendsPerSecond()), fmtCPU(h), res.errs, time.Since(start).Round(100*time.Millisecond))
		} else if w := res.wait; w != nil {
			logf("  %s %-24s %s commands per waiter-second (%s); %d/%d served after the release in %v; %d errors; took %v",
				sc.id, a.r.name, fmtRate(w.perWaiterSecond()), fmtTop(w), w.served, w.waiters, w.handover.Round(time.Millisecond), res.errs, time.Since(start).Round(100*time.Millisecond))
		} else {
			logf("  %s %-24s not measured: %s", sc.id, a.r.name, strings.Join(sortedErrTexts(res.errTexts), "; "))
		}
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
