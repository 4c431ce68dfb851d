package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// onceKeys are the keys of the Once name under the default prefix.
func onceKeys(name string) keyspace.OnceKeys { return keyspace.Once("netlock:", name, true) }

// runsScript appends "run" to $1 and pauses, so that the other netlocks
// started with it come while it runs.
const runsScript = `echo run >> "$1"; sleep 0.3`

// TestOnceThreeProcesses starts three "netlock once" at once on one name:
// the program runs once, every netlock exits 0, and a fourth, later, exits
// 0 without running it.
func TestOnceThreeProcesses(t *testing.T) {
	s := redistest.Start(t)
	log := filepath.Join(t.TempDir(), "log")
	var procs []*proc
	for range 3 {
		procs = append(procs, startNetlock(t, nil, "once", "--redis", s.Addr(), "migrate", "--", "sh", "-c", runsScript, "sh", log))
	}
	for _, p := range procs {
		if code := p.wait(); code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
		if !strings.Contains(readFile(t, log), "run") {
			t.Error("a netlock exited before the program had run")
		}
	}
	if got := readFile(t, log); got != "run\n" {
		t.Fatalf("the program's runs: got %q, want one", got)
	}
	code, _, stderr := runNetlock(t, nil, "once", "-v", "--redis", s.Addr(), "migrate", "--", "sh", "-c", runsScript, "sh", log)
	if code != 0 || readFile(t, log) != "run\n" {
		t.Errorf("a later netlock once: exit %d, runs %q; want 0 and still one run", code, readFile(t, log))
	}
	if want := `netlock once: sh had run to success already under once "migrate": nothing to do`; !strings.Contains(stderr, want) {
		t.Errorf("stderr %q does not say %q", stderr, want)
	}
	if n := redisDo(t, s, "EXISTS", onceKeys("migrate").Lock, onceKeys("migrate").Waiters); n != "0" {
		t.Errorf("the lock or its queue is left behind")
	}
}

// TestOnceExitCodes: a program that fails gives its status and records
// nothing (the next runs it); Redis out of reach gives 69; a program not
// found 127; a lock lost while the program runs 75, nothing recorded.
func TestOnceExitCodes(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	failing := `echo run >> "$1"; exit 3`
	if code, _, _ := runNetlock(t, nil, "once", "--redis", s.Addr(), "flaky", "--", "sh", "-c", failing, "sh", log); code != 3 {
		t.Errorf("a program that exits 3: exit %d, want 3", code)
	}
	if n := redisDo(t, s, "EXISTS", onceKeys("flaky").Done); n != "0" {
		t.Error("a failed run was recorded")
	}
	if code, _, _ := runNetlock(t, nil, "once", "--redis", s.Addr(), "flaky", "--", "sh", "-c", runsScript, "sh", log); code != 0 {
		t.Errorf("the run after a failed one: exit %d, want 0", code)
	}
	if got := readFile(t, log); got != "run\nrun\n" {
		t.Errorf("runs: got %q, want two (the failed one, then the next)", got)
	}

	code, _, stderr := runNetlock(t, nil, "once", "--redis", closedPort(t), "--expiry", "300ms", "job", "--", "touch", filepath.Join(dir, "ran"))
	if code != exitUnavailable || exists(filepath.Join(dir, "ran")) || !strings.Contains(stderr, "not answering") {
		t.Errorf("Redis out of reach: exit %d, stderr %q; want %d, saying so, and the program not run", code, stderr, exitUnavailable)
	}
	if code, _, _ := runNetlock(t, nil, "once", "--redis", s.Addr(), "job", "--", filepath.Join(dir, "no-such-program")); code != exitNotFound {
		t.Errorf("a program not found: exit %d, want %d", code, exitNotFound)
	}

	ready := filepath.Join(dir, "ready")
	p := startNetlock(t, nil, "once", "--redis", s.Addr(), "--expiry", "1s", "lost", "--", "sh", "-c", trapScript("TERM"), "sh", filepath.Join(dir, "marker"), ready)
	waitFor(t, "the program to start", func() bool { return exists(ready) })
	redisDo(t, s, "DEL", onceKeys("lost").Lock)
	if code := p.wait(); code != exitLost {
		t.Errorf("the lock lost while the program ran: exit %d, want %d", code, exitLost)
	}
	if want := `netlock once: lost the lock of once "lost" while sh ran; sending SIGTERM`; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr does not say %q", want)
	}
	if n := redisDo(t, s, "EXISTS", onceKeys("lost").Done); n != "0" {
		t.Error("a run whose lock was lost was recorded")
	}
}

// TestOnceRemember: with --remember the success is forgotten after the
// duration, and the next netlock once runs the program again.
func TestOnceRemember(t *testing.T) {
	s := redistest.Start(t)
	log := filepath.Join(t.TempDir(), "log")
	run := func() int {
		code, _, _ := runNetlock(t, nil, "once", "--redis", s.Addr(), "--remember", "3s", "tick", "--", "sh", "-c", `echo run >> "$1"`, "sh", log)
		return code
	}
	if run() != 0 || run() != 0 || readFile(t, log) != "run\n" {
		t.Fatalf("two runs within --remember: runs %q, want one", readFile(t, log))
	}
	if pttl := redisDo(t, s, "PTTL", onceKeys("tick").Done); pttl == "-1" || pttl == "-2" {
		t.Errorf("the record's PTTL: %s, want at most 3000", pttl)
	}
	waitFor(t, "the record to expire", func() bool { return redisDo(t, s, "EXISTS", onceKeys("tick").Done) == "0" })
	if run() != 0 || readFile(t, log) != "run\nrun\n" {
		t.Errorf("a run after --remember: runs %q, want two", readFile(t, log))
	}
}

// TestOnceBadInput: bad usage exits 64 with a message naming what is
// wrong, and runs nothing.
func TestOnceBadInput(t *testing.T) {
	s := redistest.Start(t)
	t.Setenv(envRedis, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing the lock name"},
		{[]string{"--", "true"}, "missing the lock name before --: netlock once [flags] NAME -- true"},
		{[]string{"job"}, `missing -- PROGRAM after the lock name "job"`},
		{[]string{"job", "true"}, "want -- between the lock name and the program: netlock once [flags] job -- true"},
		{[]string{"job", "--"}, "missing the program after --"},
		{[]string{"", "--", "true"}, "empty lock name"},
		{[]string{"--remember", "-1s", "job", "--", "true"}, `invalid value "-1s" for --remember: want a duration of 0 or more`},
		{[]string{"--remember", "500us", "job", "--", "true"}, "WithRemember(500µs) is below Redis's 1ms resolution"},
		{[]string{"--expiry", "1ms", "job", "--", "true"}, `invalid value "1ms" for --expiry`},
		{[]string{"--wait", "1s", "job", "--", "true"}, "unknown flag --wait"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, t.Context(), append([]string{"once", "--redis", s.Addr()}, tc.args...)...)
			if code != exitUsage || stdout != "" {
				t.Errorf("exit %d, stdout %q; want %d and nothing", code, stdout, exitUsage)
			}
			if first, _, _ := strings.Cut(stderr, "\n"); !strings.HasPrefix(first, "netlock once: ") || !strings.Contains(first, tc.want) || strings.Contains(first, "netlock once: netlock: ") {
				t.Errorf("stderr's first line %q does not say %q", first, tc.want)
			}
			if !strings.HasSuffix(stderr, "\n"+onceHint+"\n") {
				t.Errorf("stderr %q does not end with %q", stderr, onceHint)
			}
			if keys := redisDo(t, s, "KEYS", "*"); keys != "" {
				t.Errorf("keys %q on the server, want none", keys)
			}
		})
	}
}

// TestOnceWaitsForTheRun: a netlock once that comes while another runs
// the program waits, and exits only once the run has ended.
func TestOnceWaitsForTheRun(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	ready, finish := filepath.Join(dir, "ready"), filepath.Join(dir, "finish")
	script := `touch "$1"; while [ ! -e "$2" ]; do sleep 0.02; done`
	first := startNetlock(t, nil, "once", "--redis", s.Addr(), "deploy", "--", "sh", "-c", script, "sh", ready, finish)
	waitFor(t, "the program to start", func() bool { return exists(ready) })
	second := startNetlock(t, nil, "once", "--redis", s.Addr(), "deploy", "--", "sh", "-c", "echo ran again; exit 9")
	waitFor(t, "the second netlock to wait in the queue", func() bool {
		return redisDo(t, s, "ZCARD", onceKeys("deploy").Waiters) == "1"
	})
	select {
	case <-second.done:
		t.Fatal("the second netlock exited while the first ran the program")
	case <-time.After(100 * time.Millisecond):
	}
	touch(t, finish)
	if code := first.wait(); code != 0 {
		t.Errorf("the runner: exit %d, want 0", code)
	}
	if code := second.wait(); code != 0 || strings.Contains(second.stdout.String(), "ran again") {
		t.Errorf("the waiter: exit %d, stdout %q; want 0, the program not run", code, second.stdout.String())
	}
}

// TestOnceStatusAndList follows a Once through status and list: not done;
// running (status exits 1, list shows its lock with the run's token and
// holder); done, by that run, remembered; and a NetMutex of the same name
// makes status ask for --kind.
func TestOnceStatusAndList(t *testing.T) {
	s := redistest.Start(t)
	a := s.Addr()
	o, err := netlock.NewOnce("migrate", listBackends(t, a), netlock.WithExpiry(30*time.Second), netlock.WithHolderInfo("deploy-7"), netlock.WithRemember(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	status := func(args ...string) (int, string) {
		t.Helper()
		code, stdout, _ := runCmd(t, t.Context(), append(append([]string{"status", "--redis", a}, args...), "migrate")...)
		return code, stdout
	}
	if code, stdout := status("--kind", "once"); code != exitFree || !strings.HasPrefix(stdout, `once "migrate": not done`+"\n") {
		t.Errorf("before: exit %d, stdout %q; want %d, not done", code, stdout, exitFree)
	}
	var token uint64
	_, err = o.Do(t.Context(), func(ctx context.Context) error {
		info, err := o.Inspect(ctx)
		if err != nil {
			return err
		}
		token = info.Running.Token
		tok := strconv.FormatUint(token, 10)
		code, stdout := status()
		if want := regexp.MustCompile(`^once "migrate": not done; running, fencing token ` + tok + `, TTL [0-9.]+m?s, holder "deploy-7"\n`); code != exitHeld || !want.MatchString(stdout) {
			t.Errorf("running: exit %d, want %d, and a first line matching %v:\n%s", code, exitHeld, want, stdout)
		}
		rows := listJSON(t, exitOK, "--redis", a)
		if len(rows) != 1 || rows[0].Name != "migrate" || rows[0].Kind != kindOnce || tokenOf(rows[0]) != tok || !slices.Equal(rows[0].Holders, []string{"deploy-7"}) {
			t.Errorf("list while running: got %+v, want the once's lock, token %s, holder deploy-7", rows, tok)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	code, stdout := status()
	want := regexp.MustCompile(`^once "migrate": done, fencing token ` + strconv.FormatUint(token, 10) + `, holder "deploy-7", at 20[0-9-]+T[0-9:.]+Z, remembered for [0-9.]+m[0-9.]+s\n`)
	if code != exitFree || !want.MatchString(stdout) {
		t.Errorf("done: exit %d, want %d, and a first line matching %v:\n%s", code, exitFree, want, stdout)
	}
	_, stdout = status("--json")
	var j jsonOnceStatus
	if err := json.Unmarshal([]byte(stdout), &j); err != nil || j.Kind != "once" || j.State != "done" || j.Running || j.Token != token || j.HolderInfo != "deploy-7" || j.TTLMS <= 0 {
		t.Errorf("--json: got %+v, %v; want done by deploy-7 with token %d:\n%s", j, err, token, stdout)
	}
	if rows := listJSON(t, exitOK, "--redis", a); len(rows) != 0 {
		t.Errorf("list after the run: %+v, want none (a record is not a hold)", rows)
	}

	m, err := netlock.New("migrate", listBackends(t, a))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.LockCtx(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer m.UnlockCtx(context.Background())
	code, _, stderr := runCmd(t, t.Context(), "status", "--redis", a, "migrate")
	if code != exitUsage || !strings.Contains(stderr, "a NetMutex and a Once") || !strings.Contains(stderr, "--kind mutex or --kind once") {
		t.Errorf("a NetMutex and a Once of one name: exit %d, stderr %q; want %d, naming both", code, stderr, exitUsage)
	}
}
