package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// report renders the Markdown report. Every number in it comes from this run.
func report(f flags, scs []*scenario, started time.Time, took time.Duration) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	p("# netlock side by side with other Go Redis locks\n\n")
	if f.note != "" {
		p("> %s\n\n", f.note)
	}
	p("Written by `bench/` (see `bench/main.go`); every figure below was measured in one run of:\n\n")
	p("```sh\n%s\n```\n\n", command())
	p("| | |\n|---|---|\n")
	p("| date | %s (took %v) |\n", started.UTC().Format("2006-01-02 15:04 MST"), took.Round(time.Second))
	p("| machine | %s/%s, %d CPUs (GOMAXPROCS %d)%s |\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel())
	p("| Go | %s |\n", runtime.Version())
	p("| redis-server | %s; %d processes on 127.0.0.1 started by the command, `--save '' --appendonly no` |\n", redisServerVersion(), quorumServers)
	p("| netlock | %s |\n", netlockRevision())
	p("| per row | %v measured per scenario, in %d rounds of %v, after a %v warm-up; rows alternate within each round, in an order that turns from round to round |\n",
		f.duration, f.rounds, f.duration/time.Duration(f.rounds), f.warmup)
	p("| waiting scenarios | each row once, one after another: a %v warm-up, then a %v window |\n", waitWarmup, f.window)
	p("| holds scenario | each row once, one after another: %d holds for %v |\n", manyHolds, f.holdFor)
	p("\n")

	writeSummary(p, scs)

	for _, sc := range scs {
		p("## %s\n\n%s\n\n", sc.title, sc.what)
		switch sc.shape {
		case shapeOps:
			writeOpsTable(p, sc)
		case shapeContended:
			writeContendedTable(p, sc)
		case shapeWaiting:
			writeWaitingTable(p, sc)
		case shapeHolds:
			writeHoldsTable(p, sc)
		case shapeRW:
			writeRWTable(p, sc)
		case shapeSem:
			writeSemTable(p, sc)
		case shapeMulti:
			writeMultiTable(p, sc)
		case shapeElect:
			writeElectTable(p, sc)
		case shapeOnce:
			writeOnceTable(p, sc)
		}
		p("\n")
	}

	writeErrors(p, scs)
	writeContenders(p)
	writeVersions(p)
	return b.String()
}

type printer func(format string, args ...any)

func writeOpsTable(p printer, sc *scenario) {
	if sc.costOn == "" {
		p("| contender | ops/s | p50 | p99 | gave up | errors | notes |\n|---|--:|--:|--:|--:|--:|---|\n")
	} else {
		p("| contender | ops/s | p50 | p99 | server µs/op | allocs/op | gave up | errors | notes |\n|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
	}
	for _, r := range sc.rows {
		cost := ""
		if sc.costOn != "" {
			cost = " | |"
		}
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | |%s | | | %s |\n", r.name, status, cost, r.na)
			continue
		}
		if sc.costOn != "" {
			cost = fmt.Sprintf(" %s | %s |", fmtCost(r.res.serverPerOp()), fmtCost(r.res.allocsPerOp()))
		}
		p("| %s | %s | %s | %s |%s %d | %d | %s |\n", rowName(r), fmtRate(r.res.rate()), fmtPct(&r.res, 0.50), fmtPct(&r.res, 0.99), cost,
			r.res.busy, r.res.errs, r.note)
	}
}

// fmtCost renders a per-operation cost, or nothing where not measured.
func fmtCost(x float64, ok bool) string {
	if !ok {
		return ""
	}
	if x >= 100 {
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.1f", x)
}

func writeContendedTable(p printer, sc *scenario) {
	p("| contender | CS/s | holder change p50 | p99 | self-reacquire | fairness (min/max) | gave up | errors | overlaps / lost | notes |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range sc.rows {
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | | | | | | | | | %s |\n", r.name, status, r.na)
			continue
		}
		self := "–"
		if v, ok := r.res.selfPct(); ok {
			self = fmt.Sprintf("%.1f%%", v)
		}
		fair, lo, hi := r.res.fairness()
		p("| %s | %s | %s | %s | %s | %.2f (%d/%d) | %d | %d | %d / %d | %s |\n", rowName(r), fmtRate(r.res.rate()),
			fmtPct(&r.res, 0.50), fmtPct(&r.res, 0.99), self, fair, lo, hi, r.res.busy, r.res.errs, r.res.overlaps, r.res.lost, r.note)
	}
}

func writeWaitingTable(p printer, sc *scenario) {
	low, _ := lowestWaiting(sc, nil, (*waitResult).perWaiterSecond)
	p("| contender | commands per waiter-second | × lowest | without the client's keepalive PINGs | commands/s | top commands, per waiter-second | after the release | gave up | errors | overlaps | notes |\n")
	p("|---|--:|--:|--:|--:|---|--:|--:|--:|--:|---|\n")
	for _, r := range sc.rows {
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | | | | | | | | | %s |\n", r.name, status, r.na)
			continue
		}
		w := r.res.wait
		if w == nil {
			p("| %s | not measured (see Errors) | | | | | | %d | %d | %d | %s |\n", rowName(r), r.res.busy, r.res.errs, r.res.overlaps, r.note)
			continue
		}
		ratio := "–"
		if low != nil && low.perWaiterSecond() > 0 {
			ratio = fmt.Sprintf("%.1f×", w.perWaiterSecond()/low.perWaiterSecond())
		}
		p("| %s | %s | %s | %s | %s | %s | %d/%d in %s | %d | %d | %d | %s |\n", rowName(r), fmtRate(w.perWaiterSecond()), ratio,
			fmtRate(w.lockPerWaiterSecond()), fmtRate(w.perSecond(w.commands)), fmtTop(w), w.served, w.waiters, fmtDur(w.handover), r.res.busy, r.res.errs, r.res.overlaps, r.note)
	}
}

func writeHoldsTable(p printer, sc *scenario) {
	p("| contender | acquired in | lost | keys gone | peak server connections | peak goroutines | extends/s | ÷ holds/(expiry/3) | CPU while held | errors | notes |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range sc.rows {
		if status, ok := rowStatus(r); !ok {
			p("| %s | %s | | | | | | | | | %s |\n", r.name, status, r.na)
			continue
		}
		h := r.res.holds
		if h == nil {
			p("| %s | not measured (see Errors) | | | | | | | | %d | %s |\n", rowName(r), r.res.errs, r.note)
			continue
		}
		p("| %s | %s | %d | %d | %d | %d | %s | %.2f | %s | %d | %s |\n", rowName(r), fmtDur(h.acquireTook), h.lost, h.gone, h.peakConns, h.peakRoutine,
			fmtRate(h.extendsPerSecond()), h.extendsPerSecond()/h.wantExtendsPerSecond(), fmtCPU(h), r.res.errs, r.note)
	}
}

// lowestWaiting is the measured row of a waiting scenario with the lowest
// figure, among the rows that pass keep (nil: all).
func lowestWaiting(sc *scenario, keep func(*row) bool, figure func(*waitResult) float64) (*waitResult, string) {
	var low *waitResult
	var name string
	for _, r := range sc.rows {
		if _, ok := rowStatus(r); !ok || r.res.wait == nil || (keep != nil && !keep(r)) {
			continue
		}
		if low == nil || figure(r.res.wait) < figure(low) {
			low, name = r.res.wait, r.name
		}
	}
	return low, name
}

// rowStatus says why a row has no figures; ok when it has them.
func rowStatus(r *row) (string, bool) {
	switch {
	case r.na != "":
		return "n/a", false
	case r.setupErr != nil:
		return "setup failed: " + r.setupErr.Error(), false
	case !r.res.ran:
		return "not run", false
	}
	return "", true
}

func rowName(r *row) string {
	if r.c != nil && r.c.role == roleNetlock {
		return "**" + r.name + "**"
	}
	return r.name
}

func writeErrors(p printer, scs []*scenario) {
	p("## Errors\n\n")
	any := false
	for _, sc := range scs {
		for _, r := range sc.rows {
			if r.setupErr != nil {
				p("- %s / %s: setup: %s\n", sc.id, r.name, r.setupErr)
				any = true
			}
			for _, t := range sortedErrTexts(r.res.errTexts) {
				p("- %s / %s: %s\n", sc.id, r.name, t)
				any = true
			}
		}
	}
	if !any {
		p("None: no lock or unlock returned an error other than giving up while the lock was held elsewhere.\n")
	}
	p("\n")
}

func writeContenders(p printer) {
	p("## Contenders\n\n")
	p("Clients: redigo `Pool{MaxIdle: %d}`, go-redis `Options{PoolSize: %d}`, rueidis `ClientOption` defaults; lock expiry %v where the library takes one (rueidislock: its 5 s default). "+
		"Every lock and wait is bounded by the round's deadline (a context); unlocks run without it.\n\n", poolSize, poolSize, lockExpiry)
	p("| contender | module | setup |\n|---|---|---|\n")
	for _, c := range contenders() {
		p("| %s | %s %s | %s |\n", c.name, c.module, moduleVersion(c.module), c.config)
	}
	p("\n")
}

// moduleVersion is the version of module path in this binary.
func moduleVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			return depVersion(d)
		}
	}
	return "(not linked)"
}

func depVersion(d *debug.Module) string {
	switch {
	case d.Replace == nil:
		return d.Version
	case d.Replace.Version == "" || d.Replace.Version == "(devel)":
		return d.Replace.Path + " (local checkout)"
	default:
		return fmt.Sprintf("%s (replaces %s)", d.Replace.Version, d.Version)
	}
}

func writeVersions(p printer) {
	p("## Module versions\n\nFrom the binary's build information:\n\n| module | version |\n|---|---|\n")
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		p("| (no build information) | |\n\n")
		return
	}
	for _, d := range bi.Deps {
		p("| %s | %s |\n", d.Path, depVersion(d))
	}
	p("\n")
}

// command is the shell command that reproduces this run.
func command() string {
	args := []string{"cd bench && go run ."}
	for _, a := range os.Args[1:] {
		args = append(args, shellQuote(a))
	}
	return strings.Join(args, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return ", " + strings.TrimSpace(v)
		}
	}
	return ""
}

// libraryFiles are git pathspecs, relative to ../, of what the library is
// built from.
var libraryFiles = []string{"*.go", "lua", "go.mod", "go.sum", ":(exclude)bench"}

// netlockRevision names the library checked out next to bench/, which go.mod
// puts in place of the module.
func netlockRevision() string {
	rev, err := git("rev-parse", "--short=12", "HEAD")
	if err != nil {
		return "`../` (not a git checkout)"
	}
	s := fmt.Sprintf("`../` at commit %s", strings.TrimSpace(string(rev)))
	lib, err := git(append([]string{"log", "-1", "--format=%h %s", "--abbrev=12", "--"}, libraryFiles...)...)
	if err == nil && len(lib) > 0 {
		s += fmt.Sprintf(" (library last changed in %s)", strings.TrimSpace(string(lib)))
	}
	dirty, err := git(append([]string{"status", "--porcelain", "--untracked-files=no", "--"}, libraryFiles...)...)
	if err == nil && len(strings.TrimSpace(string(dirty))) > 0 {
		s += " with uncommitted changes"
	}
	return s
}

// git runs git in ../, the library's checkout.
func git(args ...string) ([]byte, error) {
	return exec.Command("git", append([]string{"-C", ".."}, args...)...).Output()
}
