package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/netlock-go/netlock"
)

const onceHelp = `Usage: netlock once [flags] NAME -- PROGRAM [ARGS...]

Runs PROGRAM once across every host that runs "netlock once NAME" on the
same Redis: the migration of a deploy, started on every pod, runs on one.
NAME is a netlock.Once. netlock reads whether PROGRAM already ran to
success under NAME, and exits 0 at once if it did. Otherwise it waits
while another host runs it, reads again, and runs PROGRAM under NAME's
lock, extended while PROGRAM runs. When PROGRAM exits 0, its success is
recorded with the hold, and the hosts that waited exit 0 without running
it; when it fails, netlock exits with its status and the next host that
waits runs it.

The success is remembered until a netlock.Once's Forget, or for
--remember. With a NAME per tick, remembered a few ticks, a cron job runs
once per tick on one of the hosts whose crontab has it (% is escaped in a
crontab):

  0 * * * * netlock once --remember 3h "report:$(date -u +\%FT\%H)" -- ./report

PROGRAM inherits netlock's stdin, stdout, stderr and environment, plus
NETLOCK_NAME. SIGINT, SIGTERM and SIGHUP sent to netlock are forwarded to
PROGRAM while it runs, and stop the wait before. If the lock is lost while
PROGRAM runs (its key expired, or Redis did not answer for --expiry),
PROGRAM gets SIGTERM, then SIGKILL after --grace, nothing is recorded, and
netlock exits with 75. While Redis does not answer, netlock keeps trying
for --expiry, then exits with 69. With -v it tells on stderr what it does.

Exit status:

  0          PROGRAM ran here and exited 0, or had run to success already
             (here or on another host, maybe while this one waited)
  PROGRAM's  PROGRAM ran here and failed (128+N: killed by signal N):
             nothing is recorded, and the next "netlock once NAME" runs it
  64         bad usage: a bad flag, argument or name; PROGRAM did not run
  69         Redis could not be asked: not reachable, not answering, not a
             Redis server, or refusing netlock's commands; PROGRAM did not
             run
  75         the lock was lost while PROGRAM ran, or its success could not
             be recorded: the next "netlock once NAME" runs it again
  126, 127   PROGRAM could not be started, or was not found
  128+N      signal N arrived while waiting; PROGRAM did not run

` + connHelp + `
Flags:
`

// onceHint follows every usage error of "netlock once".
const onceHint = `Run "netlock once --help" for usage.`

// runOnce runs "netlock once" with args (the arguments after "once") and
// returns the exit code.
func runOnce(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, remember, code, ok := parseOnceFlags(args, stdout, stderr)
	if !ok {
		return code
	}
	o := &onceRun{r: &runner{command: "once", cfg: cfg, stdout: stdout, stderr: stderr, msgs: &lockedWriter{w: stderr}}, remember: remember}
	return o.run(ctx)
}

// parseOnceFlags parses and validates args, as parseRunFlags does, with
// the flags of once. When ok is false, the caller exits with code.
func parseOnceFlags(args []string, stdout, stderr io.Writer) (cfg runConfig, remember time.Duration, code int, ok bool) {
	fs := flag.NewFlagSet("netlock once", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and help are printed below
	var cf connFlags
	cf.register(fs, false)
	cfg.expiry, cfg.grace = netlock.DefaultExpiry, 10*time.Second
	fs.Func("remember", "remember PROGRAM's success for `duration`, then run it again (default 0:\nuntil a netlock.Once's Forget)", (&durationValue{p: &remember}).Set)
	fs.Var(&durationValue{p: &cfg.expiry, min: minExpiry}, "expiry", "TTL of the lock key, a `duration` of at least "+minExpiry.String()+": how long the lock\noutlives a netlock that dies without releasing it")
	fs.Var(&durationValue{p: &cfg.grace}, "grace", "when the lock is lost: `duration` between SIGTERM and SIGKILL to the program\n(0: SIGKILL at once)")
	fs.BoolVar(&cfg.verbose, "v", false, "tell on stderr what netlock does")
	holder := &holderValue{p: &cfg.holder}
	fs.Var(holder, "holder", "the holder's `identity`, written with the hold and the record of its success\n(default: host/pid of netlock)")
	bad := func(format string, a ...any) (runConfig, time.Duration, int, bool) {
		fmt.Fprintf(stderr, "netlock once: "+format+"\n", a...)
		fmt.Fprintln(stderr, onceHint)
		return cfg, 0, exitUsage, false
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			io.WriteString(stdout, onceHelp)
			printFlags(stdout, fs)
			return cfg, 0, exitOK, false
		}
		return bad("%s", flagError(fs, err))
	}
	name, argv, msg := nameAndProgram(fs, args, "once")
	if msg != "" {
		return bad("%s", msg)
	}
	cfg.name, cfg.argv, cfg.holderSet = name, argv, holder.set
	c, err := cf.resolve(os.Getenv)
	if err != nil {
		return bad("%v", err)
	}
	cfg.conn = c
	return cfg, remember, exitOK, true
}

// A onceRun is one "netlock once": its Once, and the runner whose messages
// and program supervision it shares with "netlock run".
type onceRun struct {
	r        *runner
	remember time.Duration
	once     *netlock.Once
}

// A programExit is the status of a program that ran and failed, which the
// Once sees as its function's error.
type programExit struct{ code int }

func (e *programExit) Error() string { return "exit status " + strconv.Itoa(e.code) }

// A notStarted is a program that could not be started: its exit code.
type notStarted struct{ code int }

func (e *notStarted) Error() string { return "not started" }

// errLostRun: the lock was lost while the program ran.
var errLostRun = errors.New("lost while the program ran")

// errSignalled: a signal arrived as the lock came, before the program ran.
var errSignalled = errors.New("signalled")

// run runs the program once across the fleet and returns the exit code.
func (o *onceRun) run(ctx context.Context) int {
	r, cfg := o.r, &o.r.cfg
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	pools := cfg.conn.pools()
	defer closePools(pools)
	opts := r.options()
	if o.remember > 0 {
		opts = append(opts, netlock.WithRemember(o.remember))
	}
	once, err := netlock.NewOnce(cfg.name, backends(pools), opts...)
	if err != nil {
		r.errorf("%s", oneLine(err))
		fmt.Fprintln(r.msgs, onceHint)
		return exitUsage
	}
	o.once = once
	if _, err := exec.LookPath(cfg.argv[0]); err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			err = ee.Err
		}
		r.errorf("cannot run %q: %v", cfg.argv[0], err)
		return startFailure(err)
	}
	if msg := cfg.conn.checkProtocol(ctx, pools, min(netlock.DefaultNodeTimeout, cfg.expiry/10)); msg != "" {
		r.errorf("cannot run %s under %s: %s", cfg.argv[0], o.what(), msg)
		return exitUnavailable
	}
	r.logf("looking whether %s ran under %s, on Redis at %s", cfg.argv[0], o.what(), cfg.conn.where())
	start := time.Now()
	ran, sig, err := o.do(ctx, sigs)
	return o.exitCode(ctx, ran, sig, err, start)
}

// what names the Once in messages.
func (o *onceRun) what() string { return "once " + strconv.Quote(o.r.cfg.name) }

// do runs the Once's Do with the program as its function. A signal from
// sigs before the program started stops the wait (do returns it); once
// the program started, signals are forwarded to it.
func (o *onceRun) do(ctx context.Context, sigs <-chan os.Signal) (ran bool, sig os.Signal, err error) {
	sctx, cancel := context.WithCancel(ctx) // cancelled by a signal while waiting
	defer cancel()
	started, watching := make(chan struct{}), make(chan struct{})
	stopWatching := sync.OnceFunc(func() { close(started) })
	var got os.Signal
	go func() {
		defer close(watching)
		select {
		case got = <-sigs:
			cancel()
		case <-started:
		}
	}()
	ran, err = o.once.Do(sctx, func(fctx context.Context) error {
		stopWatching()
		<-watching // signals are the program's from here on
		if sctx.Err() != nil {
			return errSignalled // the signal came with the lock
		}
		return o.program(ctx, fctx.Done(), sigs)
	})
	stopWatching()
	<-watching // got is read after the goroutine wrote it
	return ran, got, err
}

// program runs the program, which the lock's loss (lost closed) stops,
// and returns nil when it exited 0, else why it did not.
func (o *onceRun) program(ctx context.Context, lost <-chan struct{}, sigs <-chan os.Signal) error {
	r, cfg := o.r, &o.r.cfg
	p := &program{r: r, lost: lost, held: "the lock of " + o.what()}
	cmd := exec.Command(cfg.argv[0], cfg.argv[1:]...)
	cmd.Env = append(os.Environ(), "NETLOCK_NAME="+cfg.name)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, r.stdout, r.stderr
	p.ownGroup = !hasTerminal()
	cmd.SysProcAttr = sysProcAttr(p.ownGroup)
	if err := cmd.Start(); err != nil {
		r.errorf("cannot run %s: %v", cfg.argv[0], err)
		return &notStarted{code: startFailure(err)}
	}
	p.cmd = cmd
	r.logf("started %s (pid %d)", cfg.argv[0], cmd.Process.Pid)
	if p.wait(ctx, sigs) {
		return errLostRun
	}
	ps := cmd.ProcessState
	if ps == nil {
		r.errorf("wait for %s: %v", cfg.argv[0], p.waitErr)
		return &programExit{code: exitFailed}
	}
	r.logf("%s exited: %v", cfg.argv[0], ps)
	if code := exitStatus(ps); code != 0 {
		return &programExit{code: code}
	}
	return nil
}

// exitCode reports what Do, which began at start, came to, and returns
// the exit code.
func (o *onceRun) exitCode(ctx context.Context, ran bool, sig os.Signal, err error, start time.Time) int {
	r, prog := o.r, o.r.cfg.argv[0]
	var exit *programExit
	var notRun *notStarted
	switch {
	case sig != nil:
		r.errorf("%s while waiting for %s; %s did not run", sigName(sig), o.what(), prog)
		return exitSignal(sig.(syscall.Signal))
	case err == nil && ran:
		r.logf("%s ran to success: recorded", prog)
		return exitOK
	case err == nil:
		r.logf("%s had run to success already under %s: nothing to do", prog, o.what())
		return exitOK
	case errors.As(err, &exit):
		r.logf("%s failed, %v: nothing recorded", prog, exit)
		return exit.code
	case errors.As(err, &notRun):
		return notRun.code
	case errors.Is(err, errLostRun):
		return exitLost // program.stop said so
	case ran:
		// The program exited 0, but its success could not be recorded.
		r.errorf("%s ran to success, but its success could not be recorded (the next netlock once %s runs it again): %s", prog, o.r.cfg.name, o.r.cfg.conn.failure(err))
		return exitLost
	}
	return o.notRun(ctx, err, start)
}

// notRun reports why the program did not run, Do having returned err
// before it began at start, and returns the exit code.
func (o *onceRun) notRun(ctx context.Context, err error, start time.Time) int {
	r := o.r
	if ctx.Err() != nil {
		r.errorf("stopped while waiting for %s: %v", o.what(), context.Cause(ctx))
		return exitInterrupted
	}
	after := ""
	if !isReply(err) {
		after = ", gave up after " + time.Since(start).Round(100*time.Millisecond).String()
	}
	r.errorf("cannot run %s under %s%s: %s", r.cfg.argv[0], o.what(), after, r.cfg.conn.failure(err))
	if h := authHint(err); h != "" {
		r.errorf("%s", h)
	}
	return exitUnavailable
}
