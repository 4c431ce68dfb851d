package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func mustDo(t *testing.T, s *Server, want string, args ...string) {
	t.Helper()
	got, err := s.Do(args...)
	if err != nil {
		t.Fatalf("Do(%q): %v", args, err)
	}
	if got != want {
		t.Fatalf("Do(%q) = %q, want %q", args, got, want)
	}
}

func TestStartSetGet(t *testing.T) {
	t.Parallel()
	s := Start(t)

	host, port, err := net.SplitHostPort(s.Addr())
	if err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("Addr() = %q", s.Addr())
	}
	if s.Pid() <= 0 {
		t.Fatalf("Pid() = %d", s.Pid())
	}
	mustDo(t, s, "OK", "SET", "k", "v")
	mustDo(t, s, "v", "GET", "k")
	mustDo(t, s, "", "GET", "missing")
	mustDo(t, s, "1", "EXISTS", "k")
	mustDo(t, s, "-1", "PTTL", "k")
	// Persistence is off by default.
	mustDo(t, s, "save\n", "CONFIG", "GET", "save")
	mustDo(t, s, "appendonly\nno", "CONFIG", "GET", "appendonly")
	mustDo(t, s, "port\n"+port, "CONFIG", "GET", "port")
}

func TestDoReplies(t *testing.T) {
	t.Parallel()
	s := Start(t)

	mustDo(t, s, "3", "RPUSH", "l", "a", "b", "c")
	mustDo(t, s, "a\nb\nc", "LRANGE", "l", "0", "-1")
	mustDo(t, s, "", "LRANGE", "nope", "0", "-1")
	mustDo(t, s, "1\n2\nx\n", "EVAL", "return {1, {2, 'x'}, redis.call('GET', 'nope')}", "0")
	mustDo(t, s, "with space\r\nand crlf", "ECHO", "with space\r\nand crlf")

	_, err := s.Do("NOSUCHCOMMAND")
	if err == nil || !strings.HasPrefix(err.Error(), "ERR unknown command") {
		t.Fatalf("unknown command: err = %v", err)
	}
	_, err = s.Do("EVALSHA", "0123456789012345678901234567890123456789", "0")
	if err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("EVALSHA: err = %v", err)
	}
	if _, err := s.Do(); err == nil {
		t.Fatal("Do() with no command succeeded")
	}
}

func TestReadReplyRESP3(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
		wantErr  string
	}{
		{in: "_\r\n", want: ""},
		{in: "#t\r\n", want: "1"},
		{in: ",3.5\r\n", want: "3.5"},
		{in: "(12345678901234567890\r\n", want: "12345678901234567890"},
		{in: "=7\r\ntxt:abc\r\n", want: "abc"},
		{in: "%2\r\n+a\r\n:1\r\n+b\r\n:2\r\n", want: "a\n1\nb\n2"},
		{in: "~1\r\n$1\r\nx\r\n", want: "x"},
		{in: "|1\r\n+k\r\n+v\r\n+OK\r\n", want: "OK"},
		{in: "*2\r\n-ERR inner\r\n+OK\r\n", want: "ERR inner\nOK"},
		{in: "*-1\r\n", want: ""},
		{in: "!5\r\nOOPS!\r\n", wantErr: "OOPS!"},
		{in: "-WRONGTYPE bad\r\n", wantErr: "WRONGTYPE bad"},
	} {
		got, err := readReply(bufio.NewReader(strings.NewReader(tc.in)))
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("readReply(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("readReply(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	mustDo(t, s, "OK", "SET", "k", "v")

	s.Pause()
	s.Pause() // no-op
	_, err := s.Do("GET", "k")
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Do on paused server: err = %v, want a timeout", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Do on paused server: err = %v is not a net.Error timeout", err)
	}

	s.Resume()
	s.Resume() // no-op
	mustDo(t, s, "v", "GET", "k")
}

func TestStopWhilePaused(t *testing.T) {
	t.Parallel()
	s := Start(t)
	s.Pause()
	s.Stop()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING succeeded after Stop")
	}
	s.Restart()
	mustDo(t, s, "PONG", "PING")
}

func TestKillRestartSamePort(t *testing.T) {
	t.Parallel()
	s := Start(t)
	addr, pid := s.Addr(), s.Pid()
	mustDo(t, s, "OK", "SET", "k", "v")

	s.Kill()
	s.Kill() // idempotent
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	if processAlive(pid) {
		t.Fatalf("process %d still alive after Kill", pid)
	}

	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("Addr after Restart = %q, want %q", s.Addr(), addr)
	}
	if s.Pid() == pid {
		t.Fatalf("Pid after Restart = %d, same as before", s.Pid())
	}
	mustDo(t, s, "PONG", "PING")
	// Without persistence the data is gone.
	mustDo(t, s, "", "GET", "k")
}

func TestAOFSurvivesKill(t *testing.T) {
	t.Parallel()
	s := Start(t, "--appendonly", "yes", "--appendfsync", "always")
	mustDo(t, s, "appendonly\nyes", "CONFIG", "GET", "appendonly")
	mustDo(t, s, "OK", "SET", "k", "v")
	mustDo(t, s, "OK", "SET", "ttl", "x", "PX", "600000")

	s.Kill()
	s.Restart()
	mustDo(t, s, "v", "GET", "k")
	got, err := s.Do("PTTL", "ttl")
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := strconv.Atoi(got); err != nil || ms <= 0 || ms > 600000 {
		t.Fatalf("PTTL after restart = %q", got)
	}

	// Restart of a running server stops it gracefully first.
	mustDo(t, s, "OK", "SET", "k2", "v2")
	s.Restart()
	mustDo(t, s, "v\nv2", "MGET", "k", "k2")
}

func TestStopIdempotent(t *testing.T) {
	t.Parallel()
	s := Start(t)
	pid := s.Pid()
	s.Stop()
	s.Stop()
	s.Kill()
	if processAlive(pid) {
		t.Fatalf("process %d still alive after Stop", pid)
	}
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING succeeded after Stop")
	}
	// The cleanup registered by Start calls Stop once more.
}

func TestManyServers(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for i := range 4 {
		s := Start(t)
		if seen[s.Addr()] {
			t.Fatalf("address %s used twice", s.Addr())
		}
		seen[s.Addr()] = true
		mustDo(t, s, "OK", "SET", "i", strconv.Itoa(i))
	}
}

// fakeTB records Skip and Fatal instead of stopping the test.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Skip(args ...any)      { f.skipped = true; f.msg = args[0].(string) }
func (f *fakeTB) Fatal(args ...any)     { f.failed = true; f.msg = args[0].(string) }
func (f *fakeTB) Errorf(string, ...any) {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = fmt.Sprintf(format, args...)
}

func TestRequireWithoutServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if Available() {
		t.Fatal("Available() = true with empty PATH")
	}

	t.Setenv(requireEnv, "")
	f := &fakeTB{TB: t}
	Require(f)
	if !f.skipped || f.failed {
		t.Fatalf("without %s: skipped=%v failed=%v", requireEnv, f.skipped, f.failed)
	}

	t.Setenv(requireEnv, "1")
	f = &fakeTB{TB: t}
	Require(f)
	if f.skipped || !f.failed || !strings.Contains(f.msg, "redis-server not found") {
		t.Fatalf("with %s=1: skipped=%v failed=%v msg=%q", requireEnv, f.skipped, f.failed, f.msg)
	}
}

func TestStartFailureIncludesLog(t *testing.T) {
	t.Parallel()
	f := &fakeTB{TB: t}
	Start(f, "--no-such-option", "1")
	if !f.failed || !strings.Contains(f.msg, "no-such-option") || !strings.Contains(f.msg, "exited before answering PING") {
		t.Fatalf("failed=%v msg=%q", f.failed, f.msg)
	}
}

func TestRestartPortTaken(t *testing.T) {
	t.Parallel()
	f := &fakeTB{TB: t}
	s := Start(f)
	if f.failed {
		t.Fatal(f.msg)
	}
	s.Kill()
	l, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s.Restart()
	if !f.failed || !strings.Contains(f.msg, "Address already in use") {
		t.Fatalf("failed=%v msg=%q", f.failed, f.msg)
	}
}

// RestartWith's arguments hold for the process it starts only.
func TestRestartWith(t *testing.T) {
	t.Parallel()
	s := Start(t, "--hz", "20")
	s.RestartWith("--hz", "30")
	mustDo(t, s, "hz\n30", "CONFIG", "GET", "hz")
	s.Restart()
	mustDo(t, s, "hz\n20", "CONFIG", "GET", "hz")
}

func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	return p.Signal(syscall.Signal(0)) == nil
}

// A replica started by StartReplica has synced: what the primary had
// before is there, and a write to the primary reaches it.
func TestStartReplica(t *testing.T) {
	t.Parallel()
	p := Start(t)
	mustDo(t, p, "OK", "SET", "before", "1")
	r := StartReplica(t, p.Addr())
	mustDo(t, r, "1", "GET", "before")
	mustDo(t, p, "OK", "SET", "after", "2")
	mustDo(t, p, "1", "WAIT", "1", "5000")
	mustDo(t, r, "2", "GET", "after")
}

// Sentinels started by StartSentinels name the primary, and fail it over
// to its replica when told to.
func TestStartSentinels(t *testing.T) {
	t.Parallel()
	p := Start(t)
	r := StartReplica(t, p.Addr())
	s := StartSentinels(t, 1, "netlock-test", p.Addr(), 1)
	if got, err := s.Primary(); got != p.Addr() {
		t.Fatalf("Primary: got %q (%v), want %s", got, err, p.Addr())
	}
	if err := s.Failover(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	if got, err := s.WaitPrimary(p.Addr(), 20*time.Second); got != r.Addr() {
		t.Fatalf("primary after the failover: got %q (%v), want the replica %s", got, err, r.Addr())
	}
}
