package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/netlock-go/netlock/internal/redistest"
)

// netlockBin is the netlock command, built once by TestMain, for the tests
// that run it as a process: signals, exit statuses, several at once.
var netlockBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "netlock-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	netlockBin = filepath.Join(dir, "netlock")
	if err := build(netlockBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m,
		// When rueidis.NewClient fails to connect (TestDemoUnreachable), the
		// client it abandoned schedules a topology refresh that sleeps up to
		// about a second in its own goroutine, which nothing can stop.
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
		goleak.Cleanup(func(code int) {
			os.RemoveAll(dir)
			os.Exit(code)
		}),
	)
}

// build builds this package's command into bin, with the race detector when
// the tests have it.
func build(bin string) error {
	goTool, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		return err
	}
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(goTool, append(args, ".")...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// runCmd runs the command line args (without "netlock") and returns the exit
// code and what was written to stdout and stderr.
func runCmd(t *testing.T, ctx context.Context, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(ctx, args, &out, &errOut)
	t.Logf("netlock %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// checkReport checks a successful demo's report: total increments in each
// phase, all of them counted with the lock, and a last fencing token (at
// most one per increment: holds handed between workers of one process keep
// theirs).
func checkReport(t *testing.T, stdout string, total int) {
	t.Helper()
	n := strconv.Itoa(total)
	free := regexp.MustCompile(`(?m)^without a lock:\s+` + n + ` expected,\s+\d+ counted,\s+\d+ updates? lost\s+\(`)
	locked := regexp.MustCompile(`(?m)^with NetMutex:\s+` + n + ` expected,\s+` + n + ` counted,\s+0 updates lost\s+\(.*increments/s, last fencing token (\d+)\)$`)
	if !free.MatchString(stdout) {
		t.Errorf("no line for the phase without a lock matching %v", free)
	}
	m := locked.FindStringSubmatch(stdout)
	if m == nil {
		t.Errorf("no line for the locked phase matching %v", locked)
		return
	}
	if tok, _ := strconv.Atoi(m[1]); tok < 1 || tok > total {
		t.Errorf("last fencing token %d, want 1 to %d", tok, total)
	}
}

func TestDemoEmbedded(t *testing.T) {
	for _, backend := range backendNames {
		t.Run(backend, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), "demo", "--workers", "20", "--procs", "2", "--increments", "3", "--backend", backend)
			if code != 0 {
				t.Fatalf("exit %d, want 0; stderr: %s", code, stderr)
			}
			if !strings.HasPrefix(stdout, "netlock demo: 20 workers in 2 processes, 3 increments each, 1ms pause inside (embedded Redis, "+backend+" client)\n") {
				t.Errorf("unexpected header:\n%s", stdout)
			}
			checkReport(t, stdout, 60)
			if strings.Contains(stderr, "FAIL") {
				t.Errorf("stderr reports a failure: %s", stderr)
			}
		})
	}
}

// TestDemoProcsDefault: the default --procs (4) shrinks to fit fewer workers.
func TestDemoProcsDefault(t *testing.T) {
	code, stdout, _ := runCmd(t, t.Context(), "demo", "--workers", "2", "--increments", "2", "--pause", "0")
	if code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	if !strings.Contains(stdout, "2 workers in 2 processes, 2 increments each, no pause inside") {
		t.Errorf("header does not say 2 workers in 2 processes:\n%s", stdout)
	}
	checkReport(t, stdout, 4)
}

// TestDemoRealRedis runs the demo against a real redis-server and checks that
// it leaves no key behind and touches no other key.
func TestDemoRealRedis(t *testing.T) {
	s := redistest.Start(t)
	for _, key := range []string{"counter", "netlock-demo:counter", "netlock:{demo}"} {
		if _, err := s.Do("SET", key, "keep me"); err != nil {
			t.Fatal(err)
		}
	}
	for _, backend := range backendNames {
		t.Run(backend, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), "demo", "--redis", s.Addr(), "--workers", "20", "--procs", "3", "--increments", "3", "--backend", backend)
			if code != 0 {
				t.Fatalf("exit %d, want 0; stderr: %s", code, stderr)
			}
			if !strings.Contains(stdout, "(Redis at "+s.Addr()+", "+backend+" client)") {
				t.Errorf("header does not name the server:\n%s", stdout)
			}
			checkReport(t, stdout, 60)
			checkKeys(t, s, 3)
		})
	}
}

// checkKeys checks that the server holds exactly the want keys the test set.
func checkKeys(t *testing.T, s *redistest.Server, want int) {
	t.Helper()
	keys, err := s.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(keys)); n != want {
		t.Errorf("server holds keys %q, want only the %d the test set", keys, want)
	}
}

// TestDemoInterrupted cancels the demo during its locked phase: it must stop
// promptly with exit 130, leak nothing (TestMain) and, on a real server,
// leave no lock key behind, nor any key that does not expire. A tombstone
// may stay until its TTL ends: a lock granted to a waiter that gave up is
// released by the waiter's leave and again by the release of a grant heard
// after the give-up (wait.go, orphan), and the second release, finding the
// value gone, leaves the tombstone every release of a value not held leaves.
func TestDemoInterrupted(t *testing.T) {
	s := redistest.Start(t)
	for _, backend := range backendNames {
		t.Run(backend, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			time.AfterFunc(time.Second, cancel)
			start := time.Now()
			// Unlocked about 0.2s, locked about 20*20*10ms = 4s.
			code, stdout, stderr := runCmd(t, ctx, "demo", "--redis", s.Addr(), "--backend", backend,
				"--workers", "20", "--procs", "2", "--increments", "20", "--pause", "10ms")
			if code != exitInterrupted {
				t.Errorf("exit %d, want %d", code, exitInterrupted)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("took %v to stop after the interrupt at 1s", d)
			}
			if !strings.Contains(stdout, "without a lock:") || strings.Contains(stdout, "with NetMutex:") {
				t.Errorf("want the unlocked phase's report only:\n%s", stdout)
			}
			if stderr != "netlock demo: interrupted (phase with NetMutex)\n" {
				t.Errorf("stderr does not say the locked phase was interrupted: %s", stderr)
			}
			checkKeysExpiring(t, s)
		})
	}
}

// checkKeysExpiring checks that the server holds no key but tombstones
// (":gone:"), each with a TTL.
func checkKeysExpiring(t *testing.T, s *redistest.Server) {
	t.Helper()
	keys, err := s.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range strings.Fields(keys) {
		if !strings.Contains(k, ":gone:") {
			t.Errorf("server holds key %q (keys %q), want none but expiring tombstones", k, keys)
			continue
		}
		if pttl, err := s.Do("PTTL", k); err != nil || pttl == "-1" {
			t.Errorf("tombstone %q: PTTL %s, %v: want a TTL", k, pttl, err)
		}
	}
}

// TestDemoLockBroken deletes the lock's key from the server over and over
// during the run, so the NetMutex cannot protect anything: the demo must
// notice and exit 1.
func TestDemoLockBroken(t *testing.T) {
	s := redistest.Start(t)
	stop := make(chan struct{})
	deleted := make(chan int)
	go func() {
		n := 0
		defer func() { deleted <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			keys, err := s.Do("KEYS", "netlock-demo:*{demo}")
			if err != nil {
				continue
			}
			for _, k := range strings.Fields(keys) {
				if got, err := s.Do("DEL", k); err == nil && got == "1" {
					n++
				}
			}
		}
	}()
	code, stdout, stderr := runCmd(t, t.Context(), "demo", "--redis", s.Addr(),
		"--workers", "10", "--procs", "5", "--increments", "10", "--pause", "5ms")
	close(stop)
	n := <-deleted
	t.Logf("deleted the lock key %d times", n)
	if n == 0 {
		t.Skip("the lock key was never deleted during a hold")
	}
	if code != exitFailed {
		t.Errorf("exit %d, want %d", code, exitFailed)
	}
	if !strings.Contains(stdout, "with NetMutex:") {
		t.Errorf("no report of the locked phase:\n%s", stdout)
	}
	if !strings.Contains(stderr, "netlock demo: FAIL: with NetMutex, ") || !strings.Contains(stderr, "lost before Unlock") {
		t.Errorf("stderr does not report the failure: %s", stderr)
	}
	checkKeys(t, s, 0)
}

func TestDemoUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	for _, backend := range backendNames {
		t.Run(backend, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), "demo", "--redis", addr, "--backend", backend)
			if code != 69 { // EX_UNAVAILABLE, as the help says
				t.Errorf("exit %d, want 69", code)
			}
			if stdout != "" {
				t.Errorf("stdout not empty: %s", stdout)
			}
			if !strings.Contains(stderr, "connect to Redis at "+addr) {
				t.Errorf("stderr does not name the server: %s", stderr)
			}
		})
	}
}

func TestDemoProgress(t *testing.T) {
	defer func(a, b time.Duration) { progressAfter, progressEveryPlain = a, b }(progressAfter, progressEveryPlain)
	progressAfter, progressEveryPlain = 0, 20*time.Millisecond
	code, _, stderr := runCmd(t, t.Context(), "demo", "--workers", "4", "--procs", "2", "--increments", "3", "--pause", "20ms")
	if code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	for _, want := range []string{"without a lock: ", "with NetMutex: ", "/12 increments ("} {
		if !strings.Contains(stderr, want) {
			t.Errorf("no %q in the progress on stderr", want)
		}
	}
}

func TestDemoBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"--workers", "0"}, "--workers"},
		{[]string{"--workers", "-5"}, "--workers"},
		{[]string{"--workers", "1000000"}, "--workers"},
		{[]string{"--workers", "many"}, "-workers"},
		{[]string{"--procs", "0"}, "--procs"},
		{[]string{"--workers", "10", "--procs", "11"}, "--procs"},
		{[]string{"--workers", "2", "--procs", "4"}, "--procs"},
		{[]string{"--increments", "0"}, "--increments"},
		{[]string{"--increments", "x"}, "-increments"},
		{[]string{"--pause", "-1ms"}, "--pause"},
		{[]string{"--pause", "1"}, "-pause"},
		{[]string{"--pause", "1h"}, "--pause"},
		{[]string{"--backend", "go-redis"}, "--backend"},
		{[]string{"--redis", "localhost:"}, "--redis"},
		{[]string{"--redis", ""}, "--redis"},
		{[]string{"--redis", "a:1", "--redis", "b:1"}, "--redis given more than once"},
		{[]string{"--redis", "redis://a:1/x"}, `invalid value "redis://a:1/x" for --redis: database "x"`},
		{[]string{"--user", "alice"}, "--user, --tls and --tls-ca need --redis"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"extra"}, `"extra"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), append([]string{"demo"}, tc.args...)...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if stdout != "" {
				t.Errorf("stdout not empty: %s", stdout)
			}
			first, _, _ := strings.Cut(stderr, "\n")
			if !strings.HasPrefix(first, "netlock demo: ") || !strings.Contains(first, tc.want) {
				t.Errorf("stderr's first line %q does not name %s", first, tc.want)
			}
		})
	}
}

func TestDispatch(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		code        int
		out, errOut string // substrings of stdout and stderr ("" for empty)
	}{
		{nil, exitUsage, "", "Usage:"},
		{[]string{"frobnicate"}, exitUsage, "", `netlock: unknown command "frobnicate"`},
		{[]string{"help"}, 0, "demo ", ""},
		{[]string{"--help"}, 0, "demo ", ""},
		{[]string{"-h"}, 0, "demo ", ""},
		{[]string{"help", "demo"}, 0, "-workers", ""},
		{[]string{"help", "nope"}, exitUsage, "", `unknown command "nope"`},
		{[]string{"demo", "--help"}, 0, "Usage: netlock demo [flags]", ""},
		{[]string{"demo", "-h"}, 0, "-backend", ""},
		{[]string{"help"}, 0, "\trun     run a program while holding a lock", ""},
		{[]string{"help"}, 0, "\tstatus  show whether a lock is held", ""},
		{[]string{"help", "run"}, 0, "Usage: netlock run [flags] NAME -- PROGRAM [ARGS...]", ""},
		{[]string{"run", "--help"}, 0, "  75         the hold (--elect: the leadership) was lost while PROGRAM ran", ""},
		{[]string{"run", "--help"}, 0, "\n  --elect\n", ""},
		{[]string{"run", "--help"}, 0, "  64         bad usage", ""},
		{[]string{"run", "--help"}, 0, "  69         Redis could not be asked", ""},
		{[]string{"help"}, 0, "Bad usage exits with 64 (EX_USAGE), Redis out of reach with 69 (EX_UNAVAILABLE).", ""},
		{[]string{"demo", "--help"}, 0, "64 for bad flags, 69 when Redis could not be reached", ""},
		{[]string{"run", "-h"}, 0, "-conflict-exit-code code", ""},
		{[]string{"help", "status"}, 0, "Usage: netlock status [flags] NAME", ""},
		{[]string{"status", "--help"}, 0, "Exit status: 0 free, 1 held (a NetRWMutex by a writer or by readers, a\nSemaphore by any lease, a Once by a run under way), 64 bad usage (or keys\nof several kinds without --kind), 69 too few nodes answered", ""},
		{[]string{"status", "--help"}, 0, "\n  --kind kind\n", ""},
		{[]string{"run", "--help"}, 0, "\n  --holder identity\n", ""},
		{[]string{"status", "--help"}, 0, "\n  --json\n", ""},
		{[]string{"help", "leader"}, 0, "Usage: netlock leader [flags] NAME", ""},
		{[]string{"leader", "--help"}, 0, "Exit status: 0 a leader leads (with --watch: interrupted), 1 nobody leads", ""},
		{[]string{"leader", "--help"}, 0, "\n  --watch\n", ""},
		{[]string{"run", "--help"}, 0, "\n  --wait duration\n", ""},
		{[]string{"run", "--help"}, 0, "\n  -v\ttell on stderr", ""},
		{[]string{"demo", "--help"}, 0, "\n  --workers number\n", ""},
		{[]string{"--version"}, 0, "netlock ", ""},
		{[]string{"version"}, 0, "netlock ", ""},
		{[]string{"version", "x"}, exitUsage, "", `netlock version: unexpected "x"`},
		{[]string{"help"}, 0, "\tversion show netlock's version", ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if regexp.MustCompile(`(?m)^  -[a-z][a-z]`).MatchString(stdout) {
				t.Errorf("stdout names a flag -name, want --name")
			}
			for _, c := range []struct{ name, got, want string }{{"stdout", stdout, tc.out}, {"stderr", stderr, tc.errOut}} {
				if c.want == "" && c.got != "" {
					t.Errorf("%s not empty", c.name)
				}
				if !strings.Contains(c.got, c.want) {
					t.Errorf("%s does not contain %q", c.name, c.want)
				}
			}
		})
	}
}

// TestVersion checks the version line for the build information a binary
// may have.
func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{"none", nil, false, "netlock: version unknown (built without module information)"},
		{"release", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/netlock-go/netlock", Version: "v1.2.0"}}, true, "netlock v1.2.0 (go1.26.0)"},
		{"checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "908507f0123456789abcdef0123456789abcdef0"},
			{Key: "vcs.time", Value: "2025-11-23T09:14:00Z"}, {Key: "vcs.modified", Value: "true"},
		}}, true, "netlock (devel), revision 908507f0123456789abcdef0123456789abcdef0, 2025-11-23T09:14:00Z, modified (go1.26.0)"},
		{"clean checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "908507f"}, {Key: "vcs.modified", Value: "false"},
		}}, true, "netlock (devel), revision 908507f"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := version(tc.bi, tc.ok); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestVersionBinary: a binary built from this checkout with VCS stamping
// (which GOFLAGS=-buildvcs=false, set in some environments, turns off)
// names its commit.
func TestVersionBinary(t *testing.T) {
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): the build records no revision to compare", err)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "netlock")
	if out, err := exec.Command(goTool, "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	// The version is "(devel)", or since Go 1.24 a pseudo-version made of
	// the same commit.
	want := regexp.MustCompile(`^netlock \S+, revision ` + strings.TrimSpace(string(rev)) + `, \S+(, modified)? \(go[^)]+\)\n$`)
	if err != nil || !want.Match(out) {
		t.Errorf("netlock --version: %v, stdout %q; want a line matching %v", err, out, want)
	}
}
