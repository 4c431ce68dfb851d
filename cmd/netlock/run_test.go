package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// procTimeout bounds every netlock process a test starts: one that runs
// longer is killed and the test fails, instead of hanging until go test's
// own timeout.
const procTimeout = time.Minute

// A proc is a netlock process started by a test.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{} // closed when cmd.Wait has returned
}

// syncBuffer is a bytes.Buffer that the test can read while the process
// writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startNetlock starts the netlock binary with args, in an environment
// without the test's own NETLOCK_ variables plus env. The process is killed
// when the test ends, if it is still running.
func startNetlock(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), procTimeout)
	cmd := exec.CommandContext(ctx, netlockBin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NETLOCK_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	p := &proc{t: t, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		cancel()
		close(p.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait() int {
	p.t.Helper()
	<-p.done
	p.t.Logf("netlock %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(p.cmd.Args[1:], " "), p.cmd.ProcessState, p.stdout.String(), p.stderr.String())
	code := p.cmd.ProcessState.ExitCode()
	if code < 0 {
		p.t.Fatalf("netlock did not exit by itself: %v", p.cmd.ProcessState)
	}
	return code
}

// runNetlock runs the netlock binary with args and returns its exit code,
// stdout and stderr.
func runNetlock(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startNetlock(t, env, args...)
	code = p.wait()
	return code, p.stdout.String(), p.stderr.String()
}

// waitFor polls until cond holds, failing the test if it does not within
// procTimeout. It is for waiting on other processes, never for measuring.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(procTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", procTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exists reports whether the file at path exists.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// readFile returns the content of path, "" if it does not exist.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// redisDo sends one command to s and fails the test on an error.
func redisDo(t *testing.T, s *redistest.Server, args ...string) string {
	t.Helper()
	reply, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	return reply
}

// lockKey is the lock key of name under the default prefix.
func lockKey(name string) string { return keyspace.New("netlock:", name, true).Lock }

// fenceKey is the fence counter of name under the default prefix.
func fenceKey(name string) string { return keyspace.New("netlock:", name, true).Fence }

// checkReleased checks that the lock key of name is gone from s.
func checkReleased(t *testing.T, s *redistest.Server, name string) {
	t.Helper()
	if n := redisDo(t, s, "EXISTS", lockKey(name)); n != "0" {
		t.Errorf("lock key %s still exists after netlock exited", lockKey(name))
	}
}

// TestRunExclusive starts two netlock run at once on one lock, each running a
// script that appends a start line, pauses and appends an end line: the
// scripts must run one after the other, with increasing fencing tokens.
func TestRunExclusive(t *testing.T) {
	s := redistest.Start(t)
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "start $NETLOCK_NAME $NETLOCK_TOKEN" >> "$1"; sleep 0.3; echo "end $NETLOCK_NAME $NETLOCK_TOKEN" >> "$1"`
	var procs []*proc
	for range 2 {
		procs = append(procs, startNetlock(t, nil, "run", "--redis", s.Addr(), "job", "--", "sh", "-c", script, "sh", log))
	}
	for _, p := range procs {
		if code := p.wait(); code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
	}

	lines := strings.Split(strings.TrimSuffix(readFile(t, log), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("log has %d lines, want 4:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	var last uint64
	for i := 0; i < len(lines); i += 2 {
		start, end := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(start) != 3 || start[0] != "start" || start[1] != "job" || len(end) != 3 || end[0] != "end" || start[2] != end[2] {
			t.Fatalf("lines %d and %d are %q and %q, want start and end of one run of job", i+1, i+2, lines[i], lines[i+1])
		}
		token, err := strconv.ParseUint(start[2], 10, 64)
		if err != nil || token <= last {
			t.Errorf("NETLOCK_TOKEN %q after %d, want a greater number", start[2], last)
		}
		last = token
	}
	checkReleased(t, s, "job")
}

// TestRunConflict: with the lock held elsewhere, netlock run gives up with
// the conflict code once --wait runs out, without running the program or
// touching the holder's key.
func TestRunConflict(t *testing.T) {
	s := redistest.Start(t)
	redisDo(t, s, "SET", lockKey("job"), "someone-else:7", "PX", "600000")
	for _, tc := range []struct {
		flags  []string
		code   int
		stderr string // "" for none
	}{
		{[]string{"--wait", "0"}, 1, ""},
		{[]string{"--wait", "0", "--conflict-exit-code", "9"}, 9, ""},
		{[]string{"--wait", "0", "-v"}, 1, `the lock "job" is held elsewhere (fencing token 7, TTL 9m5`},
		{[]string{"--wait", "200ms", "-v"}, 1, `gave up waiting for the lock "job" after 200ms: held elsewhere (fencing token 7, TTL 9m5`},
	} {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			args := append(append([]string{"run", "--redis", s.Addr()}, tc.flags...), "job", "--", "touch", marker)
			code, stdout, stderr := runNetlock(t, nil, args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if exists(marker) {
				t.Error("the program ran")
			}
			if stdout != "" {
				t.Errorf("stdout: got %q, want nothing", stdout)
			}
			if tc.stderr == "" && stderr != "" {
				t.Errorf("stderr: got %q, want nothing", stderr)
			}
			if !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr does not say %q", tc.stderr)
			}
			if tc.stderr != "" && !strings.Contains(stderr, "s); touch did not run\n") {
				t.Errorf("stderr does not say the program did not run")
			}
			if v := redisDo(t, s, "GET", lockKey("job")); v != "someone-else:7" {
				t.Errorf("lock key holds %q, want the other holder's someone-else:7", v)
			}
		})
	}
}

// TestRunExitStatus: netlock run exits with the program's status, as a shell
// reports it, and releases the lock.
func TestRunExitStatus(t *testing.T) {
	s := redistest.Start(t)
	for _, tc := range []struct {
		script string
		code   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"exit 255", 255},
		{"kill -KILL $$", 128 + 9},
		{"kill -TERM $$", 128 + 15},
	} {
		t.Run(tc.script, func(t *testing.T) {
			code, _, stderr := runNetlock(t, nil, "run", "--redis", s.Addr(), "job", "--", "sh", "-c", tc.script)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if stderr != "" {
				t.Errorf("stderr: got %q, want nothing", stderr)
			}
			checkReleased(t, s, "job")
		})
	}
}

// TestRunEnvironment: the program gets the lock's name and its hold's
// fencing token, which is the node's fence counter, and netlock's stdout.
func TestRunEnvironment(t *testing.T) {
	s := redistest.Start(t)
	for want := 1; want <= 2; want++ {
		code, stdout, _ := runNetlock(t, []string{"NETLOCK_TOKEN=stale", "KEEP=kept"}, "run", "--redis", s.Addr(), "orders:42", "--",
			"sh", "-c", `echo "$NETLOCK_NAME $NETLOCK_TOKEN $KEEP $1"`, "sh", "arg")
		if code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
		if got, wantOut := stdout, "orders:42 "+strconv.Itoa(want)+" kept arg\n"; got != wantOut {
			t.Errorf("program printed %q, want %q", got, wantOut)
		}
	}
	if got := redisDo(t, s, "GET", fenceKey("orders:42")); got != "2" {
		t.Errorf("fence counter %q, want 2", got)
	}
}

// TestRunCannotStart: a program that is missing or not executable is
// reported, with the shell's codes, before the lock is taken.
func TestRunCannotStart(t *testing.T) {
	s := redistest.Start(t)
	notExec := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		program string
		code    int
	}{
		{"netlock-no-such-program", 127},
		{filepath.Join(t.TempDir(), "missing"), 127},
		{notExec, 126},
	} {
		t.Run(filepath.Base(tc.program), func(t *testing.T) {
			code, _, stderr := runNetlock(t, nil, "run", "--redis", s.Addr(), "job", "--", tc.program)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if !strings.Contains(stderr, "netlock run: cannot run "+strconv.Quote(tc.program)) {
				t.Errorf("stderr does not name the program: %q", stderr)
			}
		})
	}
	if keys := redisDo(t, s, "KEYS", "*"); keys != "" {
		t.Errorf("keys %q on the server, want none: the lock was taken", keys)
	}
}

// trapScript is a program for the signal tests: it traps sig by appending
// "got <sig>" to the file $1 and exiting 5, says it is ready by creating $2,
// and otherwise runs until stopped.
func trapScript(sig string) string {
	return `trap 'echo "got ` + sig + `" >> "$1"; exit 5' ` + sig + `
echo ready > "$2"
while :; do sleep 0.05; done`
}

// TestRunLostHold: when the hold is lost while the program runs, the
// program gets SIGTERM and netlock exits with 75.
func TestRunLostHold(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(s *redistest.Server)
	}{
		{"key deleted", func(s *redistest.Server) { redisDo(t, s, "DEL", lockKey("job")) }},
		{"server paused", func(s *redistest.Server) { s.Pause() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redistest.Start(t)
			dir := t.TempDir()
			marker, ready := filepath.Join(dir, "marker"), filepath.Join(dir, "ready")
			p := startNetlock(t, nil, "run", "--redis", s.Addr(), "--expiry", "1s", "job", "--", "sh", "-c", trapScript("TERM"), "sh", marker, ready)
			waitFor(t, "the program to start", func() bool { return exists(ready) })
			tc.lose(s)
			code := p.wait()
			s.Resume()
			if code != exitLost {
				t.Errorf("exit %d, want %d", code, exitLost)
			}
			if got := readFile(t, marker); got != "got TERM\n" {
				t.Errorf("the program wrote %q, want %q", got, "got TERM\n")
			}
			if want := `netlock run: lost the lock "job" (fencing token 1) while sh ran; sending SIGTERM, SIGKILL in 10s`; !strings.Contains(p.stderr.String(), want) {
				t.Errorf("stderr does not say %q", want)
			}
		})
	}
}

// TestRunLostHoldKill: a program that ignores SIGTERM is killed, with what it
// started, when --grace runs out after the hold is lost.
func TestRunLostHoldKill(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	ready, childPid := filepath.Join(dir, "ready"), filepath.Join(dir, "child")
	// The ignored SIGTERM is inherited by the background sleep.
	script := `trap '' TERM; sleep 60 & echo $! > "$2"; echo ready > "$1"; wait`
	p := startNetlock(t, nil, "run", "--redis", s.Addr(), "--expiry", "1s", "--grace", "100ms", "job", "--", "sh", "-c", script, "sh", ready, childPid)
	waitFor(t, "the program to start", func() bool { return exists(ready) })
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, childPid)))
	if err != nil {
		t.Fatal(err)
	}
	redisDo(t, s, "DEL", lockKey("job"))
	if code := p.wait(); code != exitLost {
		t.Errorf("exit %d, want %d", code, exitLost)
	}
	if want := "sh did not exit within 100ms of SIGTERM; sending SIGKILL"; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr does not say %q", want)
	}
	waitFor(t, "the program's child to be killed", func() bool { return !alive(pid) })
}

// alive reports whether process pid runs (a zombie does not).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil { // no /proc: ask the kernel, for which zombies are alive
		p, err := os.FindProcess(pid)
		return err == nil && p.Signal(syscall.Signal(0)) == nil
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// TestRunForwardsSignals: INT, TERM and HUP sent to netlock reach the
// program; netlock exits with the program's status once it has released the
// lock.
func TestRunForwardsSignals(t *testing.T) {
	s := redistest.Start(t)
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{
		{"INT", syscall.SIGINT},
		{"TERM", syscall.SIGTERM},
		{"HUP", syscall.SIGHUP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			marker, ready := filepath.Join(dir, "marker"), filepath.Join(dir, "ready")
			p := startNetlock(t, nil, "run", "--redis", s.Addr(), "job", "--", "sh", "-c", trapScript(tc.name), "sh", marker, ready)
			waitFor(t, "the program to start", func() bool { return exists(ready) })
			if err := p.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(); code != 5 {
				t.Errorf("exit %d, want the program's 5", code)
			}
			if got, want := readFile(t, marker), "got "+tc.name+"\n"; got != want {
				t.Errorf("the program wrote %q, want %q", got, want)
			}
			// sh may report that its sleep was killed by the signal too,
			// but netlock has nothing to say.
			if stderr := p.stderr.String(); strings.Contains(stderr, "netlock") {
				t.Errorf("stderr: got %q, want nothing from netlock", stderr)
			}
			checkReleased(t, s, "job")
		})
	}
}

// TestRunSignalWhileWaiting: a signal that arrives while netlock waits for
// the lock ends the wait; the program never runs.
func TestRunSignalWhileWaiting(t *testing.T) {
	s := redistest.Start(t)
	redisDo(t, s, "SET", lockKey("job"), "someone-else:7", "PX", "600000")
	marker := filepath.Join(t.TempDir(), "ran")
	p := startNetlock(t, nil, "run", "-v", "--redis", s.Addr(), "job", "--", "touch", marker)
	waitFor(t, "netlock to wait for the lock", func() bool { return strings.Contains(p.stderr.String(), "taking the lock") })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(); code != 128+15 {
		t.Errorf("exit %d, want %d", code, 128+15)
	}
	if exists(marker) {
		t.Error("the program ran")
	}
	if want := `netlock run: SIGTERM while waiting for the lock "job"; touch did not run`; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr does not say %q", want)
	}
	if v := redisDo(t, s, "GET", lockKey("job")); v != "someone-else:7" {
		t.Errorf("lock key holds %q, want the other holder's someone-else:7", v)
	}
}

// TestRunQuorum: with three servers, netlock run holds the lock on all that
// answer, and runs with one of them down.
func TestRunQuorum(t *testing.T) {
	servers := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	args := []string{"run"}
	for _, s := range servers {
		args = append(args, "--redis", s.Addr())
	}
	servers[2].Stop()
	script := `exec "$1" status --redis "$2" --redis "$3" --redis "$4" "$NETLOCK_NAME"`
	code, stdout, _ := runNetlock(t, nil, append(args, "job", "--", "sh", "-c", script, "sh", netlockBin, servers[0].Addr(), servers[1].Addr(), servers[2].Addr())...)
	if code != exitHeld {
		t.Errorf("exit %d, want netlock status's %d (held)", code, exitHeld)
	}
	if want := `lock "job": held, fencing token 1 on 2 of 3 nodes`; !strings.Contains(stdout, want) {
		t.Errorf("status inside the run does not say %q", want)
	}
	for _, s := range servers[:2] {
		checkReleased(t, s, "job")
	}
}

// TestRunBadInput: a bad command line is reported with exit 64; the
// program does not run and nothing is held. (TestBadFlagValues has every
// flag's bad values.)
func TestRunBadInput(t *testing.T) {
	s := redistest.Start(t)
	t.Setenv(envRedis, "")
	t.Setenv(envPassword, "")
	for _, tc := range []struct {
		args []string // before NAME -- PROGRAM, or instead when prog is false
		prog bool     // append "job -- touch <marker>"
		want string   // in the first line of stderr
	}{
		{nil, false, "missing the lock name"},
		{[]string{"--", "echo", "hi"}, false, "missing the lock name before --: netlock run [flags] NAME -- echo hi"},
		{[]string{"-v", "--", "echo"}, false, "missing the lock name before --: netlock run [flags] NAME -- echo"},
		{[]string{"--"}, false, "missing the lock name and the program"},
		{[]string{"job"}, false, `missing -- PROGRAM after the lock name "job"`},
		{[]string{"job", "touch", "x"}, false, "want -- between the lock name and the program"},
		{[]string{"job", "--wait", "0", "--", "true"}, false, "--wait after the lock name: flags go before NAME"},
		{[]string{"job", "--"}, false, "missing the program after --"},
		{[]string{"job", "--", ""}, false, "empty program name"},
		{[]string{"", "--", "true"}, false, "empty lock name"},
		{[]string{"}job", "--", "true"}, false, `netlock run: lock name "}job" starts with '}'`},
		{[]string{"--wait"}, false, `--wait needs a value`},
		{[]string{"--wait", "-1s"}, true, `invalid value "-1s" for --wait: want a duration of 0 or more`},
		{[]string{"--grace", "-1s"}, true, `invalid value "-1s" for --grace: want a duration of 0 or more`},
		{[]string{"--max-time", "-1s"}, true, `invalid value "-1s" for --max-time: want a duration of 0 or more`},
		{[]string{"--max-time", "soon"}, true, `invalid value "soon" for --max-time`},
		{[]string{"--min-hold", "-1s"}, true, `invalid value "-1s" for --min-hold: want a duration of 0 or more`},
		{[]string{"--redis", "127.0.0.1:1", "--redis", "127.0.0.1:1"}, true, `invalid value "127.0.0.1:1" for --redis: given twice`},
		{[]string{"--user", "bob"}, true, "--user bob needs the password in $NETLOCK_PASSWORD"},
		{[]string{"--no-such-flag"}, true, "unknown flag --no-such-flag"},
		{[]string{"-no-such-flag"}, true, "unknown flag --no-such-flag"},
		{[]string{"--elect", "--min-hold", "1s"}, true, "--min-hold does not apply with --elect"},
		{[]string{"--elect", "--wait", "0"}, true, "--wait 0 does not apply with --elect"},
		{[]string{"--value", "10.0.0.1"}, true, "--value is the leader's value of --elect: give --elect too"},
		{[]string{"--elect", "--value", ""}, true, `invalid value "" for --value: want 1 to 4096 bytes`},
		{[]string{"--elect", "--value", strings.Repeat("v", 4097)}, true, `for --value: want 1 to 4096 bytes`},
		{[]string{"--redis", "redis://alice:hunter2@127.0.0.1:1/x"}, true, `invalid value "redis://alice:xxxxx@127.0.0.1:1/x" for --redis: database "x" is not a number`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			args := []string{"run"}
			if !containsRedis(tc.args) {
				args = append(args, "--redis", s.Addr())
			}
			args = append(args, tc.args...)
			if tc.prog {
				args = append(args, "job", "--", "touch", marker)
			}
			code, stdout, stderr := runCmd(t, t.Context(), args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if stdout != "" {
				t.Errorf("stdout: got %q, want nothing", stdout)
			}
			if first, _, _ := strings.Cut(stderr, "\n"); !strings.HasPrefix(first, "netlock run: ") || !strings.Contains(first, tc.want) || strings.Contains(first, "netlock run: netlock: ") {
				t.Errorf("stderr's first line %q does not say %q (with the prefix once)", first, tc.want)
			}
			if !strings.HasSuffix(stderr, "\n"+runHint+"\n") {
				t.Errorf("stderr %q does not end with %q", stderr, runHint)
			}
			if strings.Contains(stderr, "hunter2") {
				t.Errorf("stderr shows the password")
			}
			if exists(marker) {
				t.Error("the program ran")
			}
			if keys := redisDo(t, s, "KEYS", "*"); keys != "" {
				t.Errorf("keys %q on the server, want none", keys)
			}
		})
	}
}

// TestRunUnreachable: a Redis that refuses connections is reported with
// exit 69, naming the address and the error, once --wait or the outage
// window (--expiry) runs out, whichever comes first; not as a busy lock.
func TestRunUnreachable(t *testing.T) {
	addr := closedPort(t)
	for _, tc := range []struct {
		flags []string
		min   time.Duration // how long netlock rides out the outage; 0: not at all
	}{
		{[]string{"--wait", "0"}, 0},
		{[]string{"--wait", "1s"}, time.Second},
		{[]string{"--expiry", "1s"}, time.Second},                  // the outage window, without --wait
		{[]string{"--wait", "1s", "--expiry", "30s"}, time.Second}, // --wait first
		{[]string{"--wait", "30s", "--expiry", "1s"}, time.Second}, // the outage window first
	} {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			start := time.Now()
			code, stdout, stderr := runNetlock(t, nil, append(append([]string{"run", "--redis", addr}, tc.flags...), "job", "--", "touch", marker)...)
			took := time.Since(start)
			if code != exitUnavailable {
				t.Errorf("exit %d, want %d", code, exitUnavailable)
			}
			if took < tc.min || took > tc.min+5*time.Second {
				t.Errorf("took %v, want %v to a few seconds more", took, tc.min)
			}
			after := "" // says how long netlock rode out the outage
			if tc.min > 0 {
				after = `, gave up after [0-9.]+s`
			}
			want := regexp.MustCompile(`^netlock run: cannot take the lock "job"` + after + `: Redis at ` + regexp.QuoteMeta(addr) +
				` not answering: dial tcp ` + regexp.QuoteMeta(addr) + `: connect: connection refused\n$`)
			if !want.MatchString(stderr) {
				t.Errorf("stderr %q does not match %v", stderr, want)
			}
			if stdout != "" || exists(marker) {
				t.Errorf("the program ran")
			}
		})
	}
}

func containsRedis(args []string) bool {
	for _, a := range args {
		if a == "--redis" {
			return true
		}
	}
	return false
}

// TestRunRedisFromEnvironment: without --redis, the servers come from
// NETLOCK_REDIS.
func TestRunRedisFromEnvironment(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	code, _, stderr := runNetlock(t, []string{envRedis + "=" + a.Addr() + ", " + b.Addr()}, "run", "-v", "job", "--", "true")
	if code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	if want := "on Redis at node 0 " + a.Addr() + ", node 1 " + b.Addr(); !strings.Contains(stderr, want) {
		t.Errorf("stderr does not say %q", want)
	}
	if got := redisDo(t, b, "GET", fenceKey("job")); got != "1" {
		t.Errorf("fence counter on the second server: got %q, want 1", got)
	}
}

// TestRunVerboseWait: run -v tells who holds the lock when it starts waiting
// and every waitReportEvery while it waits.
func TestRunVerboseWait(t *testing.T) {
	defer func(d time.Duration) { waitReportEvery = d }(waitReportEvery)
	waitReportEvery = 50 * time.Millisecond
	s := redistest.Start(t)
	redisDo(t, s, "SET", lockKey("job"), "someone-else:7", "PX", "600000")
	code, _, stderr := runCmd(t, t.Context(), "run", "-v", "--redis", s.Addr(), "--wait", "1s", "job", "--", "true")
	if code != exitConflict {
		t.Errorf("exit %d, want %d", code, exitConflict)
	}
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	start := regexp.MustCompile(`^netlock run: the lock "job" is held elsewhere \(fencing token 7, TTL 9m5[0-9.]+s\); waiting up to 1s$`)
	report := regexp.MustCompile(`^netlock run: still waiting for the lock "job" after [0-9.]+m?s: held elsewhere \(fencing token 7, TTL 9m5[0-9.]+s\)$`)
	reports := 0
	for _, l := range lines {
		if report.MatchString(l) {
			reports++
		}
	}
	if len(lines) < 2 || !start.MatchString(lines[1]) {
		t.Errorf("the second line does not match %v", start)
	}
	// 1s at one report per 50ms: 20, less what a slow machine loses.
	if reports < 3 {
		t.Errorf("%d reports while waiting, want at least 3 matching %v", reports, report)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, `netlock run: gave up waiting for the lock "job" after 1s: held elsewhere (fencing token 7, TTL 9m5`) {
		t.Errorf("the last line %q does not say netlock gave up", last)
	}

	// A lock that is free: no report, just the hold.
	redisDo(t, s, "DEL", lockKey("job"))
	code, _, stderr = runNetlock(t, nil, "run", "-v", "--redis", s.Addr(), "job", "--", "true")
	if code != 0 || strings.Contains(stderr, "held elsewhere") || strings.Contains(stderr, "still waiting") {
		t.Errorf("free lock: exit %d, want 0 and no report of a holder: %q", code, stderr)
	}
}

// TestRunVerboseOutage: while Redis does not answer, run -v says so, with
// the server, its error, and until when netlock keeps trying; not that the
// lock is held, nor that who holds it cannot be told.
func TestRunVerboseOutage(t *testing.T) {
	defer func(d time.Duration) { waitReportEvery = d }(waitReportEvery)
	waitReportEvery = 50 * time.Millisecond
	addr := closedPort(t)
	start := time.Now()
	code, _, stderr := runCmd(t, t.Context(), "run", "-v", "--redis", addr, "--wait", "1s", "job", "--", "true")
	if code != exitUnavailable {
		t.Errorf("exit %d, want %d", code, exitUnavailable)
	}
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	notAnswering := `Redis at ` + regexp.QuoteMeta(addr) + ` not answering: dial tcp ` + regexp.QuoteMeta(addr) + `: connect: connection refused; retrying until ([0-9:]+) at the latest$`
	first := regexp.MustCompile(`^netlock run: ` + notAnswering)
	later := regexp.MustCompile(`^netlock run: still waiting for the lock "job" after [0-9.]+m?s: ` + notAnswering)
	if len(lines) < 2 || !first.MatchString(lines[1]) {
		t.Fatalf("the second line does not match %v", first)
	}
	// --wait ends the wait before the outage window (--expiry, 8s) would.
	until, err := time.ParseInLocation(time.TimeOnly, first.FindStringSubmatch(lines[1])[1], time.Local)
	if err != nil {
		t.Fatal(err)
	}
	y, m, d := start.Date()
	until = time.Date(y, m, d, until.Hour(), until.Minute(), until.Second(), 0, time.Local)
	if lo, hi := start.Truncate(time.Second), start.Add(2*time.Second); until.Before(lo) || until.After(hi) {
		t.Errorf("retrying until %v, want about a second after %v", until.Format(time.TimeOnly), start.Format(time.TimeOnly+".000"))
	}
	reports := 0
	for _, l := range lines[2 : len(lines)-1] {
		if !later.MatchString(l) {
			t.Errorf("line %q does not match %v", l, later)
		}
		reports++
	}
	if reports < 3 {
		t.Errorf("%d reports while waiting, want at least 3", reports)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, `netlock run: cannot take the lock "job", gave up after 1`) {
		t.Errorf("the last line %q does not say netlock gave up", last)
	}
}

// TestRunExitCodes: each of run's exit codes, in one place, as numbers:
// they are what scripts test, whatever the constants say.
func TestRunExitCodes(t *testing.T) {
	s := redistest.Start(t)
	refused := closedPort(t)
	held := func() { redisDo(t, s, "SET", lockKey("busy"), "someone-else:7", "PX", "600000") }
	for _, tc := range []struct {
		name   string
		args   []string // after "run --redis <s>", or after "run" if they have --redis
		before func()
		lose   bool // delete the lock key once the program runs
		code   int
	}{
		{"the program's 0", []string{"job", "--", "true"}, nil, false, 0},
		{"the program's own", []string{"job", "--", "sh", "-c", "exit 3"}, nil, false, 3},
		{"held elsewhere, --wait 0", []string{"--wait", "0", "busy", "--", "true"}, held, false, 1},
		{"held elsewhere, --wait ran out", []string{"--wait", "100ms", "busy", "--", "true"}, held, false, 1},
		{"held elsewhere, --conflict-exit-code", []string{"--wait", "0", "--conflict-exit-code", "9", "busy", "--", "true"}, held, false, 9},
		{"bad usage", []string{"--wait", "-1s", "job", "--", "true"}, nil, false, 64},
		{"Redis unreachable", []string{"--redis", refused, "--wait", "0", "job", "--", "true"}, nil, false, 69},
		{"the hold lost", []string{"--expiry", "1s", "job", "--", "sh", "-c", `echo ready > "$1"; sleep 30`, "sh"}, nil, true, 75},
		{"not found", []string{"job", "--", "netlock-no-such-program"}, nil, false, 127},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			args := []string{"run"}
			if !containsRedis(tc.args) {
				args = append(args, "--redis", s.Addr())
			}
			args = append(args, tc.args...)
			ready := filepath.Join(t.TempDir(), "ready")
			if tc.lose {
				args = append(args, ready)
			}
			p := startNetlock(t, nil, args...)
			if tc.lose {
				waitFor(t, "the program to start", func() bool { return exists(ready) })
				redisDo(t, s, "DEL", lockKey("job"))
			}
			if code := p.wait(); code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
		})
	}
}

// TestRunMaxTime: with --max-time the hold ends then, while the program
// runs and the key is being extended: the program gets SIGTERM, netlock
// says why and exits with 75, and the lock is free.
func TestRunMaxTime(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	marker, ready := filepath.Join(dir, "marker"), filepath.Join(dir, "ready")
	start := time.Now()
	p := startNetlock(t, nil, "run", "--redis", s.Addr(), "--expiry", "300ms", "--max-time", "1s", "job", "--", "sh", "-c", trapScript("TERM"), "sh", marker, ready)
	waitFor(t, "the program to start", func() bool { return exists(ready) })
	code := p.wait()
	if code != exitLost {
		t.Errorf("exit %d, want %d", code, exitLost)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("netlock exited %v after it started, before --max-time 1s", took)
	}
	if got := readFile(t, marker); got != "got TERM\n" {
		t.Errorf("the program wrote %q, want %q", got, "got TERM\n")
	}
	if want := `netlock run: sh ran for --max-time 1s: the hold of the lock "job" (fencing token 1) ended; sending SIGTERM, SIGKILL in 10s`; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr %q does not say %q", p.stderr.String(), want)
	}
	if keys := redisDo(t, s, "EXISTS", lockKey("job")); keys != "0" {
		t.Errorf("the lock key is still there after netlock exited")
	}
}

// TestRunMinHold: with --min-hold a program that exits at once keeps the
// lock taken for the rest: a second run in that time finds it held (exit 1,
// its program not run), one after it runs.
func TestRunMinHold(t *testing.T) {
	s := redistest.Start(t)
	begun := time.Now()
	if code, _, stderr := runCmd(t, t.Context(), "run", "--redis", s.Addr(), "--min-hold", "1s", "job", "--", "true"); code != 0 {
		t.Fatalf("first run: exit %d, stderr %q", code, stderr)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	if code, _, _ := runCmd(t, t.Context(), "run", "--redis", s.Addr(), "--wait", "0", "job", "--", "touch", marker); code != exitConflict || exists(marker) {
		t.Fatalf("a run within --min-hold: exit %d (want %d), program ran %v", code, exitConflict, exists(marker))
	}
	if code, _, stderr := runCmd(t, t.Context(), "run", "--redis", s.Addr(), "--wait", "5s", "job", "--", "touch", marker); code != 0 || !exists(marker) {
		t.Fatalf("a run waiting past --min-hold: exit %d, program ran %v, stderr %q", code, exists(marker), stderr)
	}
	if took := time.Since(begun); took < time.Second {
		t.Errorf("the second program ran %v after the first run began, within --min-hold 1s", took)
	}
}

// electScript is a program for the --elect tests: it writes its
// NETLOCK_NAME and NETLOCK_TOKEN to the file $1, then runs until the file
// $2 exists (then exits 3) or it gets SIGTERM (then appends "got TERM" to
// $1 and exits 5).
const electScript = `trap 'echo "got TERM" >> "$1"; exit 5' TERM
echo "$NETLOCK_NAME $NETLOCK_TOKEN" > "$1"
while [ ! -e "$2" ]; do sleep 0.05; done
exit 3`

// electTerm waits until the electScript that writes to out has started, and
// returns the term it was given; it checks the name too.
func electTerm(t *testing.T, out, name string) uint64 {
	t.Helper()
	waitFor(t, "the program to start", func() bool { return strings.HasSuffix(readFile(t, out), "\n") })
	first, _, _ := strings.Cut(readFile(t, out), "\n")
	f := strings.Fields(first)
	if len(f) != 2 || f[0] != name {
		t.Fatalf("the program wrote %q, want its NETLOCK_NAME %s and NETLOCK_TOKEN", first, name)
	}
	term, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil || term == 0 {
		t.Fatalf("NETLOCK_TOKEN %q, want a term", f[1])
	}
	return term
}

// touch creates the file path.
func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRunElectHandOver: two standbys of one election: the first elected
// runs its program while the second waits; a third that gives up after
// --wait exits with the conflict code; when the first program exits,
// netlock exits with its status and resigns, and the second is elected at
// once (well within --expiry) with a greater term and runs its program.
func TestRunElectHandOver(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	leader := func() (int, string) {
		code, stdout, _ := runCmd(t, t.Context(), "leader", "--redis", s.Addr(), "jobs")
		return code, stdout
	}
	run := func(value string) (p *proc, out, stop string) {
		out, stop = filepath.Join(dir, value+".out"), filepath.Join(dir, value+".stop")
		p = startNetlock(t, nil, "run", "-v", "--elect", "--value", value, "--expiry", "30s", "--redis", s.Addr(), "jobs", "--", "sh", "-c", electScript, "sh", out, stop)
		return p, out, stop
	}
	first, out1, stop1 := run("first")
	term1 := electTerm(t, out1, "jobs")
	second, out2, stop2 := run("second")
	waitFor(t, "the second to campaign", func() bool {
		return strings.Contains(second.stderr.String(), `the leadership of "jobs" is held elsewhere (leader "first", term `+strconv.FormatUint(term1, 10)+`); waiting`)
	})
	if code, stdout := leader(); code != exitOK || !strings.Contains(stdout, `leader "first"`) {
		t.Errorf("netlock leader: exit %d, %q; want the first leading", code, stdout)
	}
	marker := filepath.Join(dir, "third")
	if code, _, _ := runNetlock(t, nil, "run", "--elect", "--wait", "200ms", "--redis", s.Addr(), "jobs", "--", "touch", marker); code != exitConflict || exists(marker) {
		t.Errorf("a third with --wait 200ms: exit %d (want %d), its program ran: %v", code, exitConflict, exists(marker))
	}
	if exists(out2) {
		t.Fatal("the second program runs while the first leads")
	}

	handOver := time.Now()
	touch(t, stop1)
	if code := first.wait(); code != 3 {
		t.Errorf("the first netlock: exit %d, want its program's 3", code)
	}
	term2 := electTerm(t, out2, "jobs")
	if took := time.Since(handOver); took > 10*time.Second {
		t.Errorf("the second was elected %v after the first program exited: not by the resign (--expiry 30s)", took)
	}
	if term2 <= term1 {
		t.Errorf("the second's term %d, want more than the first's %d", term2, term1)
	}
	if code, stdout := leader(); code != exitOK || !strings.Contains(stdout, `leader "second"`) {
		t.Errorf("netlock leader: exit %d, %q; want the second leading", code, stdout)
	}
	touch(t, stop2)
	if code := second.wait(); code != 3 {
		t.Errorf("the second netlock: exit %d, want its program's 3", code)
	}
	if code, stdout := leader(); code != exitNoLeader {
		t.Errorf("netlock leader after both exited: exit %d, %q; want %d, no leader", code, stdout, exitNoLeader)
	}
}

// TestRunElectFailover: when the leader's netlock dies (SIGKILL), its
// leadership expires after --expiry and the standby is elected and runs its
// program; the dead leader's program gets SIGTERM (Linux).
func TestRunElectFailover(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	out1, out2 := filepath.Join(dir, "first.out"), filepath.Join(dir, "second.out")
	first := startNetlock(t, nil, "run", "--elect", "--expiry", "1s", "--redis", s.Addr(), "jobs", "--", "sh", "-c", electScript, "sh", out1, filepath.Join(dir, "stop1"))
	term1 := electTerm(t, out1, "jobs")
	stop2 := filepath.Join(dir, "stop2")
	second := startNetlock(t, nil, "run", "--elect", "--expiry", "1s", "--redis", s.Addr(), "jobs", "--", "sh", "-c", electScript, "sh", out2, stop2)
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.done
	if term2 := electTerm(t, out2, "jobs"); term2 <= term1 {
		t.Errorf("the standby's term %d, want more than the dead leader's %d", term2, term1)
	}
	if runtime.GOOS == "linux" {
		waitFor(t, "the dead leader's program to get SIGTERM", func() bool { return strings.Contains(readFile(t, out1), "got TERM") })
	}
	touch(t, stop2)
	if code := second.wait(); code != 3 {
		t.Errorf("the standby: exit %d, want its program's 3", code)
	}
}

// TestRunElectLost: when the leadership is lost while the program runs
// (the election's lock key deleted), or --max-time ends it, the program gets
// SIGTERM and netlock exits with 75, as for a lost lock.
func TestRunElectLost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		lose  bool   // delete the election's lock key once the program runs
		said  string // what netlock says, with %d for the term
	}{
		{"key deleted", nil, true, `netlock run: lost the leadership of "jobs" (term %d) while sh ran; sending SIGTERM, SIGKILL in 10s`},
		{"--max-time", []string{"--max-time", "1s"}, false, `netlock run: sh ran for --max-time 1s: the leadership of "jobs" (term %d) ended; sending SIGTERM, SIGKILL in 10s`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redistest.Start(t)
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			args := append([]string{"run", "--elect", "--expiry", "1s", "--redis", s.Addr()}, tc.flags...)
			p := startNetlock(t, nil, append(args, "jobs", "--", "sh", "-c", electScript, "sh", out, filepath.Join(dir, "stop"))...)
			term := electTerm(t, out, "jobs")
			if tc.lose {
				redisDo(t, s, "DEL", keyspace.Election("netlock:", "jobs").Lock)
			}
			if code := p.wait(); code != exitLost {
				t.Errorf("exit %d, want %d", code, exitLost)
			}
			if !strings.HasSuffix(readFile(t, out), "got TERM\n") {
				t.Errorf("the program wrote %q, want it to end with got TERM", readFile(t, out))
			}
			if want := fmt.Sprintf(tc.said, term); !strings.Contains(p.stderr.String(), want) {
				t.Errorf("stderr does not say %q", want)
			}
		})
	}
}

// TestRunHolder: --holder sets the identity the hold carries, which status
// shows from inside the run; --holder "" writes none.
func TestRunHolder(t *testing.T) {
	s := redistest.Start(t)
	script := `"$1" status --redis "$2" "$NETLOCK_NAME"`
	for _, c := range []struct{ holder, want string }{
		{"ci job 42: deploy", `, holder "ci job 42: deploy"` + "\n"},
		{"", "\n"},
	} {
		code, stdout, _ := runNetlock(t, nil, "run", "--redis", s.Addr(), "--holder", c.holder, "job", "--", "sh", "-c", script, "sh", netlockBin, s.Addr())
		if code != exitHeld {
			t.Errorf("--holder %q: exit %d, want the status's %d", c.holder, code, exitHeld)
		}
		first, _, _ := strings.Cut(stdout, "\n")
		if !regexp.MustCompile(`^lock "job": held, fencing token [0-9]+, TTL [0-9.]+m?s` + regexp.QuoteMeta(c.want)).MatchString(first + "\n") {
			t.Errorf("--holder %q: status inside the run says %q, want it to end %q", c.holder, first, c.want)
		}
	}
}
