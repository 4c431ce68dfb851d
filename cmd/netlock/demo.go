package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"golang.org/x/term"

	"github.com/netlock-go/netlock"
)

// Limits of the demo's flags: generous, but they keep a typo from starting
// millions of goroutines or an hour-long pause.
const (
	maxWorkers    = 10000
	maxIncrements = 100000
	maxPause      = 10 * time.Second
	defaultProcs  = 4
)

// opTimeout bounds every GET, SET, DEL and SCAN the demo sends itself (the
// NetMutex bounds its own calls).
const opTimeout = 5 * time.Second

// Progress on stderr: a phase that runs longer than progressAfter shows how
// far it got, every progressEvery on a terminal (one line, rewritten) and
// every progressEveryPlain otherwise (one line each time). Variables, so that
// tests can shorten them.
var (
	progressAfter      = time.Second
	progressEvery      = 500 * time.Millisecond
	progressEveryPlain = 2 * time.Second
)

// demoConfig is the demo's validated flags.
type demoConfig struct {
	server     *node // nil for the embedded server
	workers    int
	procs      int
	increments int
	pause      time.Duration
	backend    string
}

const demoHelp = `Usage: netlock demo [flags]

Runs one read-modify-write race twice on a counter in Redis. --workers
goroutines, spread over --procs simulated processes (each with its own Redis
client and its own NetMutex on one lock name), each do --increments times:
GET counter, pause, SET counter to the value read plus one.

  1. without a lock: increments overwrite each other and updates are lost;
  2. with NetMutex:  each increment runs under the worker's process's
                     NetMutex, and no update may be lost.

By default Redis is embedded in the demo (miniredis): nothing to set up.
With --redis the demo uses a real server, under keys unique to the run that
it deletes afterwards. It authenticates as run does (--user,
$NETLOCK_PASSWORD, or a URL), but does not read $NETLOCK_REDIS.

` + addrHelp + `
Exit status: 0 when the locked phase counted every update, 1 when it did
not, 64 for bad flags, 69 when Redis could not be reached or failed.

Flags:
`

// runDemo runs "netlock demo" with args (the arguments after "demo") and
// returns the exit code.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, code, ok := parseDemoFlags(args, stdout, stderr)
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return demo(ctx, cfg, stdout, stderr)
}

// parseDemoFlags parses and validates args. When ok is false, the caller
// should exit with code: help was shown (0) or the flags are bad
// (exitUsage, the message already on stderr).
func parseDemoFlags(args []string, stdout, stderr io.Writer) (cfg demoConfig, code int, ok bool) {
	fs := flag.NewFlagSet("netlock demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and help are printed below
	var cf connFlags
	cf.register(fs, true)
	cfg.workers, cfg.increments, cfg.pause, cfg.backend = 100, 5, time.Millisecond, "redigo"
	fs.Var(&intValue{p: &cfg.workers, min: 1, max: maxWorkers}, "workers", "`number` of worker goroutines, 1 to "+strconv.Itoa(maxWorkers))
	// No default shown: it depends on --workers.
	fs.Func("procs", "`number` of simulated processes the workers are spread over, each with its\nown Redis client and its own NetMutex: 1 to --workers (default 4, or --workers\nif fewer)", (&intValue{p: &cfg.procs, min: 1}).Set)
	fs.Var(&intValue{p: &cfg.increments, min: 1, max: maxIncrements}, "increments", "`number` of increments each worker makes, 1 to "+strconv.Itoa(maxIncrements))
	fs.Var(&durationValue{p: &cfg.pause, max: maxPause}, "pause", "the pause between GET and SET, a `duration` from 0 to "+maxPause.String())
	fs.Var(&choiceValue{p: &cfg.backend, choices: backendNames}, "backend", "Redis client `library`: "+(&choiceValue{choices: backendNames}).want())
	printHelp := func(w io.Writer) {
		fmt.Fprint(w, demoHelp)
		printFlags(w, fs)
	}
	bad := func(format string, a ...any) (demoConfig, int, bool) {
		fmt.Fprintf(stderr, "netlock demo: "+format+"\n", a...)
		fmt.Fprintln(stderr, `Run "netlock demo --help" for usage.`)
		return cfg, exitUsage, false
	}

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout)
			return cfg, exitOK, false
		}
		return bad("%s", flagError(fs, err))
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q: demo takes only flags", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	if !set["procs"] {
		cfg.procs = min(defaultProcs, cfg.workers)
	}
	if cfg.procs > cfg.workers {
		return bad("%s", badValue("--procs", strconv.Itoa(cfg.procs), fmt.Sprintf("want a whole number from 1 to --workers (%d)", cfg.workers)))
	}
	server, err := cf.resolveDemo(os.Getenv)
	if err != nil {
		return bad("%v", err)
	}
	cfg.server = server
	return cfg, exitOK, true
}

// demo runs both phases and prints the report.
func demo(ctx context.Context, cfg demoConfig, stdout, stderr io.Writer) (code int) {
	d := &demoRun{cfg: cfg, stdout: stdout, stderr: stderr}
	stopServer, err := d.startServer()
	if err != nil {
		return d.fail(ctx, "start embedded Redis", err)
	}
	defer stopServer()

	// Every key of the run starts with prefix: the counter, and, through
	// WithPrefix, the lock and its fence counter. On a shared server this
	// keeps runs apart, and the cleanup deletes exactly the run's keys.
	d.prefix = demoPrefix()
	counterKey := d.prefix + "counter"

	defer d.closeProcesses()
	if code, ok := d.startProcesses(ctx); !ok {
		return code
	}
	admin := d.procs[0].client
	defer func() {
		// Delete the run's keys even when interrupted; the clients are
		// closed after this (deferred earlier, so run later).
		if !d.deleteKeys(ctx, admin) && code == exitOK {
			code = exitUnavailable
		}
	}()
	if err := admin.del(ctx, counterKey); err != nil {
		return d.fail(ctx, d.where+" does not answer", err)
	}
	d.printHeader()

	free, err := runPhase(ctx, "without a lock", cfg, d.procs, counterKey, false, stderr)
	if err != nil {
		return d.fail(ctx, "phase without a lock", err)
	}
	d.printPhase("without a lock", free, "")

	locked, err := runPhase(ctx, "with NetMutex", cfg, d.procs, counterKey, true, stderr)
	if err != nil {
		return d.fail(ctx, "phase with NetMutex", err)
	}
	d.printPhase("with NetMutex", locked, fmt.Sprintf(", last fencing token %d", locked.lastToken))

	if err := admin.del(ctx, counterKey); err != nil {
		return d.fail(ctx, "delete "+counterKey, err)
	}
	return d.verdict(free, locked)
}

// A demoRun is one run of the demo: its flags, its output, the server it
// uses and the simulated processes it started.
type demoRun struct {
	cfg            demoConfig
	stdout, stderr io.Writer
	server         *node  // the server used: --redis's, or the embedded one
	where          string // the server, for messages
	prefix         string // every key of the run starts with it
	procs          []*process
}

// fail says on stderr that what failed with err, or that ctx ended while
// doing it, and returns the exit code.
func (d *demoRun) fail(ctx context.Context, what string, err error) int {
	if ctx.Err() != nil {
		fmt.Fprintf(d.stderr, "netlock demo: interrupted (%s)\n", what)
		return exitInterrupted
	}
	if s := oneLine(err); d.cfg.server != nil && strings.HasPrefix(s, notRedisText) {
		fmt.Fprintf(d.stderr, "netlock demo: %s %s\n", d.cfg.server.name, s)
	} else {
		fmt.Fprintf(d.stderr, "netlock demo: %s: %s\n", what, s)
	}
	return exitUnavailable
}

// startServer picks the server the demo uses: the one --redis names, or an
// embedded one that it starts. It returns the function that stops the
// embedded server, which does nothing for --redis's.
func (d *demoRun) startServer() (stop func(), err error) {
	if d.cfg.server != nil {
		d.server, d.where = d.cfg.server, "Redis at "+d.cfg.server.name
		return func() {}, nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, err
	}
	d.server, d.where = &node{name: mr.Addr(), network: "tcp", address: mr.Addr()}, "embedded Redis"
	return mr.Close, nil
}

// demoPrefix returns a prefix for the keys of one run, unique to it.
func demoPrefix() string {
	id := make([]byte, 6)
	rand.Read(id)
	return "netlock-demo:" + hex.EncodeToString(id) + ":"
}

// startProcesses starts the simulated processes, each connected to the
// server with its NetMutex. It reports false, after saying why on stderr,
// if one could not be started, and returns the exit code; the processes
// started so far are for closeProcesses to close.
func (d *demoRun) startProcesses(ctx context.Context) (code int, ok bool) {
	d.procs = make([]*process, 0, d.cfg.procs)
	perProc := (d.cfg.workers + d.cfg.procs - 1) / d.cfg.procs
	for range d.cfg.procs {
		c, err := dial(d.cfg.backend, d.server, perProc)
		if err != nil {
			return d.fail(ctx, "connect to "+d.where, err), false
		}
		p := &process{client: c}
		d.procs = append(d.procs, p)
		// No logger: the demo counts and reports the holds lost itself.
		p.mu, err = netlock.New("demo", []netlock.Backend{c.backend()}, netlock.WithPrefix(d.prefix), netlock.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			return d.fail(ctx, "create the NetMutex", err), false
		}
	}
	return exitOK, true
}

// closeProcesses closes the clients of the processes started.
func (d *demoRun) closeProcesses() {
	for _, p := range d.procs {
		p.client.close()
	}
}

// deleteKeys deletes the run's keys with admin, even when ctx has ended. It
// reports false, after saying why on stderr, if they could not be deleted.
func (d *demoRun) deleteKeys(ctx context.Context, admin client) bool {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if err := admin.deleteMatching(cctx, d.prefix+"*"); err != nil {
		fmt.Fprintf(d.stderr, "netlock demo: delete the demo's keys %s*: %s\n", d.prefix, oneLine(err))
		return false
	}
	return true
}

// printHeader prints the line that says what the demo runs, and where.
func (d *demoRun) printHeader() {
	pause := "no pause"
	if d.cfg.pause > 0 {
		pause = d.cfg.pause.String() + " pause"
	}
	fmt.Fprintf(d.stdout, "netlock demo: %s in %s, %s each, %s inside (%s, %s client)\n\n",
		plural(d.cfg.workers, "worker"), plural(d.cfg.procs, "process"), plural(d.cfg.increments, "increment"),
		pause, d.where, d.cfg.backend)
}

// printPhase prints the line of the phase label's result r, with extra at
// its end.
func (d *demoRun) printPhase(label string, r phaseResult, extra string) {
	total := int64(d.cfg.workers) * int64(d.cfg.increments)
	width := len(strconv.FormatInt(total, 10))
	lost := r.expected - r.counted
	fmt.Fprintf(d.stdout, "%-16s %*d expected, %*d counted, %*d %s   (%s, %.0f increments/s%s)\n",
		label+":", width, r.expected, width, r.counted, width, lost, lostWord(lost),
		seconds(r.wall), float64(r.expected)/r.wall.Seconds(), extra)
}

// verdict says on stderr what went wrong in the locked phase, if anything,
// or remarks on stdout that the unlocked phase, free, lost no update, and
// returns the exit code.
func (d *demoRun) verdict(free, locked phaseResult) int {
	if problems := lockedProblems(locked); len(problems) > 0 {
		fmt.Fprintf(d.stderr, "\nnetlock demo: FAIL: with NetMutex, %s\n", strings.Join(problems, "; "))
		return exitFailed
	}
	if free.counted == free.expected && d.cfg.workers > 1 {
		fmt.Fprintln(d.stdout, "\n(no update was lost without a lock this time: more --workers or a longer --pause make the race likelier)")
	}
	return exitOK
}

// lockedProblems returns what the locked phase's result r shows went
// wrong: lost updates, overlaps, tokens out of order, holds lost. It
// returns none if the lock did its work.
func lockedProblems(r phaseResult) []string {
	var problems []string
	if lost := r.expected - r.counted; lost != 0 {
		problems = append(problems, fmt.Sprintf("%d expected but %d counted", r.expected, r.counted))
	}
	if r.overlaps > 0 {
		problems = append(problems, fmt.Sprintf("a worker entered the critical section while another was in it %s", plural(int(r.overlaps), "time")))
	}
	if r.backwards > 0 {
		problems = append(problems, fmt.Sprintf("%s out of order (below the one before, or equal in another process)", plural(int(r.backwards), "fencing token")))
	}
	if r.lostHolds > 0 {
		problems = append(problems, fmt.Sprintf("%s lost before Unlock (ErrLockLost)", plural(int(r.lostHolds), "hold")))
	}
	return problems
}

// A process stands for one process of an application: its own Redis client
// (its own connections) and its own NetMutex on the shared lock name.
type process struct {
	client client
	mu     *netlock.NetMutex
}

// phaseResult is what one phase measured.
type phaseResult struct {
	expected, counted int64
	wall              time.Duration
	lastToken         uint64 // highest fencing token seen (locked phase)
	overlaps          int64  // times a worker was in the critical section with another (locked phase)
	backwards         int64  // tokens below the previous holder's, or equal in another process (locked phase)
	lostHolds         int64  // unlocks that found the hold lost (locked phase)
}

// runPhase resets the counter, runs every worker's increments, each under its
// process's NetMutex when locked, and reads the counter back. It fails on
// the first error of any worker, after stopping the others.
func runPhase(ctx context.Context, label string, cfg demoConfig, procs []*process, key string, locked bool, stderr io.Writer) (phaseResult, error) {
	r := phaseResult{expected: int64(cfg.workers) * int64(cfg.increments)}
	admin := procs[0].client
	if err := admin.del(ctx, key); err != nil {
		return r, fmt.Errorf("reset %s: %w", key, err)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ph := &phase{key: key, pause: cfg.pause, locked: locked, cancel: cancel}
	r.wall = ph.run(ctx, label, cfg, procs, stderr)

	if ph.firstErr != nil {
		return r, ph.firstErr
	}
	if err := context.Cause(ctx); err != nil {
		return r, err // interrupted
	}
	n, err := admin.get(ctx, key)
	if err != nil {
		return r, fmt.Errorf("read %s: %w", key, err)
	}
	r.counted = n
	r.lastToken = ph.last
	r.overlaps = ph.overlaps.Load()
	r.backwards = ph.backwards.Load()
	r.lostHolds = ph.lostHolds.Load()
	return r, nil
}

// A phase is what the workers of one phase share while they run: the
// counter's key, the counts of the locked phase's checks, and the first
// error. It must not be copied after first use.
type phase struct {
	key    string
	pause  time.Duration
	locked bool
	cancel context.CancelCauseFunc // stops the other workers, with the first error

	done, inside, overlaps, backwards, lostHolds atomic.Int64

	tokMu    sync.Mutex
	last     uint64   // highest fencing token seen; under tokMu
	lastProc *process // the process that saw it; under tokMu

	errOnce  sync.Once
	firstErr error // set once, read after the workers return
}

// run runs cfg.workers workers, spread over procs, each making
// cfg.increments increments, showing the phase label's progress on stderr,
// and returns how long they took. It blocks until every worker has
// returned: at its last increment, at its first error, or when ctx ends.
func (ph *phase) run(ctx context.Context, label string, cfg demoConfig, procs []*process, stderr io.Writer) time.Duration {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range cfg.workers {
		p := procs[w%len(procs)]
		wg.Go(func() {
			<-start
			ph.work(ctx, p, cfg.increments)
		})
	}
	stopProgress := showProgress(stderr, label, int64(cfg.workers)*int64(cfg.increments), &ph.done)
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)
	stopProgress()
	return wall
}

// work makes increments increments in process p, one after another. It
// stops when ctx ends, or at its first error, which it records for the
// phase and which stops the other workers.
func (ph *phase) work(ctx context.Context, p *process, increments int) {
	for range increments {
		if ctx.Err() != nil {
			return
		}
		if err := ph.step(ctx, p); err != nil {
			ph.fail(err)
			return
		}
		ph.done.Add(1)
	}
}

// fail records err as the phase's error, if it is the first, and stops the
// other workers.
func (ph *phase) fail(err error) {
	ph.errOnce.Do(func() { ph.firstErr = err; ph.cancel(err) })
}

// step makes one increment in process p: under p's NetMutex in the locked
// phase, checking it, and bare otherwise. It returns the increment's error,
// joined with the unlock's.
func (ph *phase) step(ctx context.Context, p *process) error {
	if !ph.locked {
		return increment(ctx, p.client, ph.key, ph.pause)
	}
	if err := p.mu.LockCtx(ctx); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	ph.checkHold(p)
	err := increment(ctx, p.client, ph.key, ph.pause)
	ph.inside.Add(-1)
	switch uerr := p.mu.UnlockCtx(ctx); {
	case errors.Is(uerr, netlock.ErrLockLost):
		// The lock key expired or was deleted or taken while we held
		// it: the increment was not protected. Go on, and report it.
		ph.lostHolds.Add(1)
	case uerr != nil:
		err = errors.Join(err, fmt.Errorf("unlock: %w", uerr))
	}
	return err
}

// checkHold enters the critical section with p's hold (the caller leaves
// it with inside.Add(-1)), and counts what shows the hold unprotected:
// another worker inside, or a token below the previous holder's (or equal
// to it in another process).
func (ph *phase) checkHold(p *process) {
	// Checks independent of the counter: nobody else is inside, and
	// tokens grow from one holder to the next. A hold handed between
	// workers of one process keeps its token.
	if ph.inside.Add(1) > 1 {
		ph.overlaps.Add(1)
	}
	tok := p.mu.Token()
	ph.tokMu.Lock()
	if tok < ph.last || (tok == ph.last && p != ph.lastProc) {
		ph.backwards.Add(1)
	}
	ph.last, ph.lastProc = max(ph.last, tok), p
	ph.tokMu.Unlock()
}

// increment is the racy read-modify-write: GET, pause, SET value+1.
func increment(ctx context.Context, c client, key string, pause time.Duration) error {
	v, err := c.get(ctx, key)
	if err != nil {
		return fmt.Errorf("GET %s: %w", key, err)
	}
	if pause > 0 {
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
	if err := c.set(ctx, key, v+1); err != nil {
		return fmt.Errorf("SET %s: %w", key, err)
	}
	return nil
}

// showProgress reports done/total on stderr while a phase runs, once it has
// run for progressAfter. The returned function stops it and, on a terminal,
// clears the line; it returns when nothing more will be written.
func showProgress(stderr io.Writer, label string, total int64, done *atomic.Int64) (stop func()) {
	tty := isTerminal(stderr)
	every := progressEveryPlain
	if tty {
		every = progressEvery
	}
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		wait := time.NewTimer(progressAfter)
		defer wait.Stop()
		select {
		case <-quit:
			return
		case <-wait.C:
		}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			n := done.Load()
			msg := fmt.Sprintf("%s: %d/%d increments (%d%%)", label, n, total, n*100/total)
			if tty {
				fmt.Fprintf(stderr, "\r%s\x1b[K", msg)
			} else {
				fmt.Fprintln(stderr, msg)
			}
			select {
			case <-quit:
				if tty {
					fmt.Fprint(stderr, "\r\x1b[K")
				}
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		close(quit)
		<-exited
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd())) // not /dev/null, also a character device
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	if strings.HasSuffix(word, "s") {
		return strconv.Itoa(n) + " " + word + "es"
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func lostWord(n int64) string {
	if n == 1 || n == -1 {
		return "update lost "
	}
	return "updates lost"
}

func seconds(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}
