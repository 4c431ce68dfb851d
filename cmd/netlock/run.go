package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/netlock-go/netlock"
)

// forwarded are the signals netlock run passes on to the program.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

const runHelp = `Usage: netlock run [flags] NAME -- PROGRAM [ARGS...]

Runs PROGRAM while holding the lock NAME, so that one program at a time runs
under that name, on any number of hosts: like flock(1), over Redis.

netlock waits for the lock (--wait bounds the wait, --wait 0 tries once),
starts PROGRAM, keeps the hold extended while PROGRAM runs, releases it when
PROGRAM exits, and exits with PROGRAM's exit status. PROGRAM inherits
netlock's stdin, stdout, stderr and environment, plus:

  NETLOCK_NAME   the lock's name
  NETLOCK_TOKEN  the hold's fencing token, a number that increases with every
                 hold of NAME: give it to what PROGRAM writes to, so that a
                 late write of an earlier holder can be refused

The hold carries its holder's identity, which "netlock status" and "netlock
list" show: --holder, by default host/pid of netlock (the program's parent).

netlock writes to stderr only, and only errors unless -v. With -v it tells
what it does, and while it waits for the lock, who holds it (fencing token,
TTL), or that Redis does not answer and until when netlock keeps trying:
when the wait starts and every 5 seconds.

SIGINT, SIGTERM and SIGHUP sent to netlock are forwarded to PROGRAM, and
netlock waits for it to exit. If the hold is lost while PROGRAM runs (its key
expired or was deleted, or Redis did not answer for --expiry), PROGRAM gets
SIGTERM, then SIGKILL after --grace, and netlock exits with 75. PROGRAM runs
in a process group of its own, so that these signals reach every process it
started. On a terminal it stays in netlock's process group, so that it can
read the terminal; Ctrl-C then reaches it directly, and netlock does not
forward that SIGINT a second time.

While Redis does not answer (connections refused, a server restarting,
calls that time out), netlock keeps trying for --expiry,
or until --wait runs out if that comes first, and then exits with 69.

With --elect, NAME is an election (a netlock.Election, the one "netlock
leader NAME" shows) and PROGRAM runs while this netlock leads it: a hot
standby. netlock campaigns with --value (default: host/pid) and waits its
turn behind the other campaigners, in order of arrival (--wait bounds the
campaign; without it, netlock waits as long as it takes). Once elected it
starts PROGRAM with NETLOCK_TOKEN the term, a fencing token that grows with
every new leader. If the leadership is lost while PROGRAM runs, PROGRAM is
stopped and netlock exits with 75, as for a lost hold; when PROGRAM exits,
netlock resigns, and the next campaigner's turn comes at once. Run it under
a supervisor that restarts it to campaign again. --wait 0 and --min-hold
do not apply to an election.

Exit status:

  PROGRAM's  PROGRAM ran and exited with that status (128+N: killed by signal N)
  1          the lock is held elsewhere (--elect: another leads): --wait ran
             out, or --wait 0 found it held; PROGRAM did not run (the code
             is --conflict-exit-code's)
  64         bad usage: a bad flag, argument or lock name; PROGRAM did not run
  69         Redis could not be asked: not reachable, not answering, not a
             Redis server, or refusing netlock's commands (a password, a
             permission); PROGRAM did not run and nothing is held
  75         the hold (--elect: the leadership) was lost while PROGRAM ran
             (or was found lost when releasing it after PROGRAM exited), or
             --max-time ran out
  126, 127   PROGRAM could not be started, or was not found
  128+N      signal N arrived while waiting for the lock; PROGRAM did not run

` + connHelp + `
Flags:
`

// runConfig is "netlock run"'s validated command line.
type runConfig struct {
	conn     *conn
	name     string
	argv     []string      // PROGRAM and ARGS
	expiry   time.Duration // of the lock key
	wait     time.Duration // 0: try once; forever when waitSet is false
	waitSet  bool
	grace    time.Duration // SIGTERM to SIGKILL when the hold is lost
	maxTime  time.Duration // --max-time: the hold ends then; 0: no bound
	minHold  time.Duration // --min-hold: the lock stays taken that long at least
	conflict int           // exit code when the lock is busy
	verbose  bool
	elect    bool   // --elect: NAME is an election, PROGRAM runs while leading
	value    string // --elect's leader value
	// holder is --holder, the identity written with the hold, when set
	// (holderSet); otherwise the library's default, host/pid of netlock.
	holder    string
	holderSet bool
}

// minExpiry is the shortest --expiry: netlock waits at most a tenth of the
// expiry for each answer from Redis (netlock.WithNodeTimeout's default), and
// a round trip with a TLS handshake rarely fits in much less than 10ms.
const minExpiry = 100 * time.Millisecond

// waitReportEvery is how often "run -v" tells who holds the lock it waits
// for. A variable, so that tests can shorten it.
var waitReportEvery = 5 * time.Second

// runRun runs "netlock run" with args (the arguments after "run") and
// returns the exit code.
func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, code, ok := parseRunFlags(args, stdout, stderr)
	if !ok {
		return code
	}
	r := &runner{command: "run", cfg: cfg, stdout: stdout, stderr: stderr, msgs: &lockedWriter{w: stderr}}
	return r.run(ctx)
}

// runHint follows every usage error of "netlock run", as the other
// commands' follow theirs.
const runHint = `Run "netlock run --help" for usage.`

// parseRunFlags parses and validates args. When ok is false, the caller
// should exit with code: help was shown (0) or the command line is bad
// (exitUsage, the message already on stderr).
func parseRunFlags(args []string, stdout, stderr io.Writer) (cfg runConfig, code int, ok bool) {
	fs := flag.NewFlagSet("netlock run", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and help are printed below
	var cf connFlags
	cf.register(fs, false)
	cfg.expiry, cfg.grace, cfg.conflict = netlock.DefaultExpiry, 10*time.Second, exitConflict
	fs.Var(&durationValue{p: &cfg.expiry, min: minExpiry}, "expiry", "TTL of the lock key, a `duration` of at least "+minExpiry.String()+": how long the lock\noutlives a netlock that dies without releasing it; the hold is extended\nevery third of it")
	// No default shown: without --wait, netlock waits as long as it takes.
	fs.Func("wait", "wait at most `duration` for the lock, 0 to try once (default: as long as it takes)", (&durationValue{p: &cfg.wait}).Set)
	fs.Var(&durationValue{p: &cfg.grace}, "grace", "when the hold is lost: `duration` between SIGTERM and SIGKILL to the program\n(0: SIGKILL at once)")
	// Their usage says the default, 0, and what it means: the flag package
	// adds none for a Func flag, as for --wait.
	fs.Func("max-time", "end the hold `duration` after it was taken, as if lost: the program gets\nSIGTERM (then SIGKILL after --grace), and netlock exits with 75; the key\nexpires at the latest --expiry later (default 0: no bound)", (&durationValue{p: &cfg.maxTime}).Set)
	fs.Func("min-hold", "keep the lock taken at least `duration` after it was taken, even if the program\nexits sooner, so that it runs at most once per duration on any host (default 0)", (&durationValue{p: &cfg.minHold}).Set)
	fs.Var(&intValue{p: &cfg.conflict, min: 0, max: 255}, "conflict-exit-code", "exit `code` when the lock is held elsewhere, 0 to 255")
	fs.BoolVar(&cfg.verbose, "v", false, "tell on stderr what netlock does, and while waiting who holds the lock")
	fs.BoolVar(&cfg.elect, "elect", false, "NAME is an election: campaign to lead it and run the program while leading")
	fs.StringVar(&cfg.value, "value", "", "with --elect, the leader's `value` that \"netlock leader\" shows (default: host/pid)")
	holder := &holderValue{p: &cfg.holder}
	fs.Var(holder, "holder", "the holder's `identity`, written with the hold, which \"netlock status\" and \"netlock list\"\nshow: up to 256 bytes of printable UTF-8, \"\" for none (default: host/pid of netlock)")
	bad := func(format string, a ...any) (runConfig, int, bool) {
		fmt.Fprintf(stderr, "netlock run: "+format+"\n", a...)
		fmt.Fprintln(stderr, runHint)
		return cfg, exitUsage, false
	}

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, runHelp)
			printFlags(stdout, fs)
			return cfg, exitOK, false
		}
		return bad("%s", flagError(fs, err))
	}
	name, argv, msg := nameAndProgram(fs, args, "run")
	if msg != "" {
		return bad("%s", msg)
	}
	cfg.name, cfg.argv = name, argv
	cfg.holderSet = holder.set
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg.waitSet = set["wait"]
	if msg := cfg.checkElect(set); msg != "" {
		return bad("%s", msg)
	}
	c, err := cf.resolve(os.Getenv)
	if err != nil {
		return bad("%v", err)
	}
	cfg.conn = c
	return cfg, exitOK, true
}

// nameAndProgram returns the NAME -- PROGRAM [ARGS...] that follow the
// flags of "netlock command" in args, which fs parsed; or what is wrong
// with them.
func nameAndProgram(fs *flag.FlagSet, args []string, command string) (name string, argv []string, msg string) {
	rest := fs.Args()
	switch {
	case dashDashFirst(fs, args) && len(rest) == 0:
		return "", nil, "missing the lock name and the program: netlock " + command + " [flags] NAME -- PROGRAM [ARGS...]"
	case dashDashFirst(fs, args):
		return "", nil, fmt.Sprintf("missing the lock name before --: netlock %s [flags] NAME -- %s", command, strings.Join(rest, " "))
	case len(rest) == 0:
		return "", nil, "missing the lock name: netlock " + command + " [flags] NAME -- PROGRAM [ARGS...]"
	case len(rest) == 1:
		return "", nil, fmt.Sprintf("missing -- PROGRAM after the lock name %q", rest[0])
	case rest[1] != "--" && strings.HasPrefix(rest[1], "-"):
		return "", nil, rest[1] + " after the lock name: flags go before NAME"
	case rest[1] != "--":
		return "", nil, fmt.Sprintf("want -- between the lock name and the program: netlock %s [flags] %s -- %s", command, rest[0], strings.Join(rest[1:], " "))
	case len(rest) == 2:
		return "", nil, "missing the program after --"
	case rest[2] == "":
		return "", nil, "empty program name"
	}
	return rest[0], rest[2:], ""
}

// checkElect returns what is wrong with --elect and the other flags set
// (their names, as the flag package has them), "" if nothing is.
func (cfg *runConfig) checkElect(set map[string]bool) string {
	switch {
	case !cfg.elect && set["value"]:
		return "--value is the leader's value of --elect: give --elect too"
	case !cfg.elect:
		return ""
	case set["min-hold"]:
		return "--min-hold does not apply with --elect: a leader that resigns makes way at once"
	case cfg.waitSet && cfg.wait == 0:
		return "--wait 0 does not apply with --elect: a campaign waits its turn; give --wait a duration"
	case set["value"] && (cfg.value == "" || len(cfg.value) > netlock.MaxLeaderValue):
		return badValue("--value", cfg.value, fmt.Sprintf("want 1 to %d bytes", netlock.MaxLeaderValue))
	case !set["value"]:
		cfg.value = defaultValue()
	}
	return ""
}

// whyLost returns why the hold was lost, once Lost() has closed: the
// Observer is called right after (see netlock.Observer), so a second is
// plenty; "" if it was not.
func (r *runner) whyLost() netlock.LostReason {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case why := <-r.lostWhy:
		return why
	case <-t.C:
		return ""
	}
}

// A runner is one "netlock run" (or the program of one "netlock once").
type runner struct {
	command        string // "run" or "once", after "netlock " in messages
	cfg            runConfig
	stdout, stderr io.Writer
	// msgs is stderr for netlock's own messages, one line per Write,
	// serialized: they come from the goroutine that waits, the one that
	// reports while waiting (-v), and the library's logger. The program
	// gets stderr itself, not a pipe.
	msgs io.Writer
	h    held // the lock's hold, or the election's leadership (--elect)
	// lostWhy is told why the hold was lost, right after Lost() closes
	// (see netlock.Observer).
	lostWhy chan netlock.LostReason
}

// lockedWriter serializes the writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// logger is the library's logger for the NetMutex: nothing without -v (run
// reports a lost hold or a failed release itself, in its own words); with
// -v, its warnings, on stderr after "netlock run: ", one sentence a line.
func (r *runner) logger() *slog.Logger {
	if !r.cfg.verbose {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(&lineHandler{prefix: "netlock " + r.command + ": ", w: r.msgs, level: slog.LevelWarn, node: r.cfg.conn.nodeNamer()})
}

// errorf reports on stderr, always.
func (r *runner) errorf(format string, a ...any) {
	fmt.Fprintf(r.msgs, "netlock "+r.command+": "+format+"\n", a...)
}

// logf reports on stderr with -v.
func (r *runner) logf(format string, a ...any) {
	if r.cfg.verbose {
		r.errorf(format, a...)
	}
}

// run takes the lock (or the leadership), runs the program under it and
// gives it back. It returns the exit code.
func (r *runner) run(ctx context.Context) int {
	cfg := &r.cfg
	// From here on, INT, TERM and HUP are netlock's to handle: they stop
	// the wait for the lock, or go to the program. The buffer keeps a signal
	// that arrives while the program is being started.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	pools := cfg.conn.pools()
	defer closePools(pools)
	if err := r.newHeld(backends(pools)); err != nil {
		// The flags are checked already: what is left is the name, which
		// New checks as Inspect does for status: bad usage.
		r.errorf("%s", oneLine(err))
		fmt.Fprintln(r.msgs, runHint)
		return exitUsage
	}

	// A program that cannot run is reported before the lock is taken.
	if _, err := exec.LookPath(cfg.argv[0]); err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			err = ee.Err // without exec's own prefix
		}
		r.errorf("cannot run %q: %v", cfg.argv[0], err)
		return startFailure(err)
	}

	// So is a server that is not Redis: the wait would take it for one
	// that does not answer, until --wait or --expiry ran out.
	if msg := cfg.conn.checkProtocol(ctx, pools, min(netlock.DefaultNodeTimeout, cfg.expiry/10)); msg != "" {
		r.errorf("cannot take %s: %s", r.h.what(), msg)
		return exitUnavailable
	}

	start := time.Now()
	sig, err := r.acquire(ctx, sigs)
	if sig != nil {
		r.errorf("%s while waiting for %s; %s did not run", sigName(sig), r.h.what(), cfg.argv[0])
		return exitSignal(sig.(syscall.Signal))
	}
	if err != nil {
		return r.notTaken(ctx, err, start)
	}
	r.logf("acquired %s with %s %d after %v", r.h.what(), r.h.tokenName(), r.h.token(), time.Since(start).Round(time.Millisecond))
	return r.supervise(ctx, sigs)
}

// newHeld makes r.h on backends: the NetMutex NAME, or with --elect the
// Election NAME, with the options the flags set. Its error is New's or
// NewElection's.
func (r *runner) newHeld(backends []netlock.Backend) error {
	cfg := &r.cfg
	opts := r.options()
	if cfg.elect {
		e, err := netlock.NewElection(cfg.name, backends, opts...)
		if err != nil {
			return err
		}
		r.h = &leadership{e: e, value: cfg.value}
		return nil
	}
	if cfg.minHold > 0 {
		opts = append(opts, netlock.WithMinHold(cfg.minHold))
	}
	m, err := netlock.New(cfg.name, backends, opts...)
	if err != nil {
		return err
	}
	r.h = &lockHold{m: m, backends: backends, opts: opts}
	return nil
}

// options returns the options the flags set, with the logger and the
// Observer that tells r.lostWhy.
func (r *runner) options() []netlock.Option {
	cfg := &r.cfg
	opts := []netlock.Option{
		netlock.WithExpiry(cfg.expiry),
		// A wait rides out Redis not answering for --expiry (runHelp says
		// so), or until --wait ends it: then LockCtx's error matches
		// ErrQuorum all the same, so the wait need not bound the window.
		netlock.WithOutageWindow(cfg.expiry),
		netlock.WithPrefix(cfg.conn.prefix),
		netlock.WithLogger(r.logger()),
	}
	r.lostWhy = make(chan netlock.LostReason, 1)
	opts = append(opts, netlock.WithObserver(netlock.Observer{Lost: func(l netlock.LostHold) {
		select {
		case r.lostWhy <- l.Reason:
		default:
		}
	}}))
	if cfg.maxTime > 0 {
		opts = append(opts, netlock.WithMaxHold(cfg.maxTime))
	}
	if cfg.holderSet {
		opts = append(opts, netlock.WithHolderInfo(cfg.holder))
	}
	return opts
}

// notTaken reports why acquire, which began at start, returned err, and
// returns the exit code.
func (r *runner) notTaken(ctx context.Context, err error, start time.Time) int {
	cfg := &r.cfg
	switch {
	case errors.Is(err, errBusy):
		if r.cfg.verbose {
			// Who holds it, if Redis still says: it may have been released
			// since.
			who := ""
			if state, held := r.holder(ctx); held {
				who = " " + state
			}
			if cfg.waitSet && cfg.wait == 0 {
				r.logf("%s is held elsewhere%s; %s did not run", r.h.what(), who, cfg.argv[0])
			} else {
				r.logf("gave up waiting for %s after %v: held elsewhere%s; %s did not run", r.h.what(), cfg.wait, who, cfg.argv[0])
			}
		}
		return cfg.conflict
	case ctx.Err() != nil:
		r.errorf("stopped while waiting for %s: %v", r.h.what(), context.Cause(ctx))
		return exitInterrupted
	}
	// Redis could not be asked (err matches ErrQuorum): at once for an
	// error reply or with --wait 0, else after riding it out.
	after := ""
	if !isReply(err) && !(cfg.waitSet && cfg.wait == 0) {
		after = ", gave up after " + time.Since(start).Round(100*time.Millisecond).String()
	}
	r.errorf("cannot take %s%s: %s", r.h.what(), after, cfg.conn.failure(err))
	if h := authHint(err); h != "" {
		r.errorf("%s", h)
	}
	return exitUnavailable
}

// errBusy means the lock was held elsewhere until --wait ran out (or, with
// --elect, another led).
var errBusy = errors.New("busy")

// acquire takes r.h, once (--wait 0), until --wait runs out, or as long as
// it takes. A signal from sigs stops it: acquire then returns the signal,
// with nothing held. Otherwise it returns nil (r.h is ours), errBusy, or
// the error of its take.
func (r *runner) acquire(ctx context.Context, sigs <-chan os.Signal) (os.Signal, error) {
	sctx, cancel := context.WithCancel(ctx) // cancelled by a signal
	defer cancel()
	actx := sctx
	if r.cfg.waitSet && r.cfg.wait > 0 {
		var stop context.CancelFunc
		actx, stop = context.WithTimeout(sctx, r.cfg.wait)
		defer stop()
	}
	var sig os.Signal
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case sig = <-sigs:
			cancel()
		case <-done:
		}
	})

	try := r.cfg.waitSet && r.cfg.wait == 0
	r.logf("taking %s on Redis at %s", r.h.what(), r.cfg.conn.where())
	if r.cfg.verbose && !try {
		// Who holds it, or that Redis does not answer: once now (before
		// we could hold it ourselves) and then every waitReportEvery
		// until the wait ends.
		w := &waitReport{r: r, start: time.Now()}
		if d, ok := actx.Deadline(); ok {
			w.deadline = d
		}
		w.look(actx, nil)
		wg.Go(func() { w.run(actx, done) })
	}
	err := r.h.take(actx, try)
	close(done)
	wg.Wait() // sig is read after the goroutine wrote it

	if sig != nil {
		if err == nil {
			// The lock came with the signal: give it back unused.
			r.release(ctx)
		}
		return sig, nil
	}
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.Is(err, netlock.ErrNotObtained) && errors.Is(err, context.DeadlineExceeded):
		return nil, errBusy // --wait ran out while another held the lock
	case actx.Err() != nil:
		// --wait ran out while Redis did not answer: the message says what
		// the nodes did, and how long netlock waited.
		err = withoutCause(err, context.Cause(actx))
	}
	return nil, err
}

// supervise runs the program while r.h is ours and returns the exit code.
// It forwards signals, stops the program when r.h is lost, and gives r.h
// back when the program has exited.
func (r *runner) supervise(ctx context.Context, sigs <-chan os.Signal) int {
	cfg := &r.cfg
	token := r.h.token()
	p := &program{r: r, token: token, lost: r.h.lost(), held: fmt.Sprintf("%s (%s %d)", r.h.what(), r.h.tokenName(), token)}
	cmd := exec.Command(cfg.argv[0], cfg.argv[1:]...)
	cmd.Env = append(os.Environ(), "NETLOCK_NAME="+cfg.name, "NETLOCK_TOKEN="+strconv.FormatUint(p.token, 10))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, r.stdout, r.stderr
	p.ownGroup = !hasTerminal()
	cmd.SysProcAttr = sysProcAttr(p.ownGroup)
	if err := cmd.Start(); err != nil {
		r.release(ctx)
		r.errorf("cannot run %s: %v", cfg.argv[0], err)
		return startFailure(err)
	}
	p.cmd = cmd
	r.logf("started %s (pid %d)", cfg.argv[0], cmd.Process.Pid)
	lostHold := p.wait(ctx, sigs)

	code := exitFailed
	if ps := cmd.ProcessState; ps != nil {
		code = exitStatus(ps)
		r.logf("%s exited: %v", cfg.argv[0], ps)
	} else {
		r.errorf("wait for %s: %v", cfg.argv[0], p.waitErr)
	}
	if !r.release(ctx) && !lostHold {
		r.errorf("%s (%s %d) was lost while %s ran: found when releasing it", r.h.what(), r.h.tokenName(), p.token, cfg.argv[0])
		lostHold = true
	}
	if lostHold {
		return exitLost
	}
	return code
}

// A program is the program of one run, started while r.h is ours.
type program struct {
	r        *runner
	cmd      *exec.Cmd
	ownGroup bool            // it runs in a process group of its own
	token    uint64          // r.h's, when the program started
	lost     <-chan struct{} // r.h's
	// held names what the program runs under in messages, with its
	// token: `the lock "job" (fencing token 7)`.
	held    string
	waitErr error // cmd.Wait's, once it exited
}

// wait waits for the program to exit, forwarding signals, and stopping it
// (SIGTERM, SIGKILL after --grace) if r.h is lost meanwhile, which it then
// reports as true.
func (p *program) wait(ctx context.Context, sigs <-chan os.Signal) (lost bool) {
	exited := make(chan struct{})
	go func() {
		p.waitErr = p.cmd.Wait()
		close(exited)
	}()
	lostC, ctxDone := p.lost, ctx.Done()
	var (
		kill  *time.Timer
		killC <-chan time.Time
	)
	defer func() {
		if kill != nil {
			kill.Stop()
		}
	}()
	for {
		select {
		case <-exited:
			return lost
		case sig := <-sigs:
			if sig == syscall.SIGINT && !p.ownGroup {
				// The program shares netlock's process group on the
				// terminal, which sent this SIGINT to both.
				continue
			}
			p.r.logf("forwarding %s to %s", sigName(sig), p.cmd.Args[0])
			p.send(sig.(syscall.Signal))
		case <-ctxDone:
			// Only an in-process caller's context ends (main's never does):
			// ask the program to stop, as a SIGTERM to netlock would.
			ctxDone = nil
			p.send(syscall.SIGTERM)
		case <-lostC:
			lostC, lost = nil, true
			if kill = p.stop(); kill != nil {
				killC = kill.C
			}
		case <-killC:
			killC = nil
			p.r.errorf("%s did not exit within %v of SIGTERM; sending SIGKILL", p.cmd.Args[0], p.r.cfg.grace)
			p.send(syscall.SIGKILL)
		}
	}
}

// stop says that r.h was lost and stops the program: SIGKILL at once with
// --grace 0, else SIGTERM, and a timer for the SIGKILL, which it returns.
func (p *program) stop() *time.Timer {
	r, prog := p.r, p.cmd.Args[0]
	what := fmt.Sprintf("lost %s while %s ran", p.held, prog)
	if r.whyLost() == netlock.LostMaxHold { // run only: once has no --max-time
		what = fmt.Sprintf("%s ran for --max-time %v: %s (%s %d) ended", prog, r.cfg.maxTime, r.h.hold(), r.h.tokenName(), p.token)
	}
	if r.cfg.grace == 0 {
		r.errorf("%s; killing it", what)
		p.send(syscall.SIGKILL)
		return nil
	}
	r.errorf("%s; sending SIGTERM, SIGKILL in %v", what, r.cfg.grace)
	p.send(syscall.SIGTERM)
	return time.NewTimer(r.cfg.grace)
}

// send sends sig to the program (to its process group if it has its own),
// and reports a failure.
func (p *program) send(sig syscall.Signal) {
	if err := signalProgram(p.cmd.Process, p.ownGroup, sig); err != nil {
		p.r.errorf("send %s to %s (pid %d): %v", sigName(sig), p.cmd.Args[0], p.cmd.Process.Pid, err)
	}
}

// startFailure is the exit code for a program that could not be started,
// as shells have it: 127 when it was not found, 126 otherwise.
func startFailure(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, exec.ErrDot) {
		return exitNotFound
	}
	return exitNoExec
}

// release gives r.h back and reports whether it was still ours: false if
// it had been lost. A release that could not reach Redis is reported; the
// key then expires on its own within --expiry.
func (r *runner) release(ctx context.Context) (held bool) {
	// Detached: the release must happen even when ctx has ended. UnlockCtx
	// and Resign bound it by the node timeout.
	switch err := r.h.release(context.WithoutCancel(ctx)); {
	case errors.Is(err, netlock.ErrLockLost), errors.Is(err, netlock.ErrNotLeader):
		return false
	case err != nil:
		r.errorf("cannot release %s (it expires within %v): %s", r.h.what(), r.cfg.expiry, r.cfg.conn.errText(err))
	default:
		r.logf("released %s", r.h.what())
	}
	return true
}

// exitStatus is the status a shell would report for a process: its exit
// code, or 128+N if signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// sigName names a signal as ps and kill do: SIGTERM.
func sigName(sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGKILL:
		return "SIGKILL"
	}
	return sig.String()
}
