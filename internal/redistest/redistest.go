// Package redistest starts and stops real redis-server processes for tests.
//
// Each server listens on a free 127.0.0.1 port, keeps its files in its own
// t.TempDir(), has persistence disabled unless extra arguments enable it, and
// is stopped automatically when the test finishes:
//
//	func TestSomething(t *testing.T) {
//		s := redistest.Start(t)
//		client := newClient(s.Addr())
//		...
//	}
//
// Tests that need a real server are skipped when redis-server is not on PATH,
// unless NETLOCK_REQUIRE_REDIS=1 is set, in which case they fail.
//
// The methods that control the process (Pause, Resume, Kill, Stop, Restart)
// report failures with Fatalf on the testing.TB passed to Start, so, like
// t.Fatal, they must be called from the goroutine running the test.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	serverBinary  = "redis-server"
	requireEnv    = "NETLOCK_REQUIRE_REDIS"
	readyTimeout  = 10 * time.Second
	pollInterval  = 10 * time.Millisecond
	probeTimeout  = 500 * time.Millisecond
	stopTimeout   = 5 * time.Second
	killTimeout   = 10 * time.Second
	doTimeout     = 2 * time.Second
	startAttempts = 5
	logTailBytes  = 4096
	logFileName   = "redis-server.log"
)

// errAddrInUse marks a start attempt that failed because the port was taken.
var errAddrInUse = errors.New("address already in use")

// Available reports whether redis-server is on PATH.
func Available() bool {
	_, err := exec.LookPath(serverBinary)
	return err == nil
}

// Require is called by tests that need a real server: if redis-server is not
// available it calls t.Skip, unless the environment variable
// NETLOCK_REQUIRE_REDIS=1, in which case it calls t.Fatal with a clear message.
func Require(t testing.TB) {
	t.Helper()
	if Available() {
		return
	}
	if os.Getenv(requireEnv) == "1" {
		t.Fatal("redistest: redis-server not found on PATH, but " + requireEnv +
			"=1 requires a real Redis server (install redis-server >= 7.0 or unset " + requireEnv + ")")
		return
	}
	t.Skip("redistest: redis-server not found on PATH; skipping test that needs a real Redis server (set " +
		requireEnv + "=1 to fail instead)")
}

// Server is a redis-server process started by Start, or a redis-sentinel
// started by StartSentinels. Its address, directory and arguments stay the
// same across Restart.
type Server struct {
	t       testing.TB
	dir     string
	logPath string
	port    int
	busPort int // cluster bus port (--cluster-port), 0 when not a cluster node
	// sentinelConf names the configuration file, in dir, of a
	// redis-sentinel; "" for a redis-server.
	sentinelConf string
	addr         string
	extra        []string

	mu     sync.Mutex
	p      *proc // running process, nil when stopped
	pid    int   // pid of the most recently started process
	paused bool
}

// proc is one redis-server process.
type proc struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd.Wait has returned
	err    error         // result of cmd.Wait, valid once done is closed
	logOff int64         // offset in the log file where this process's output starts
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process, ignoring the error if it has already exited.
func (p *proc) signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil && !p.exited() && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("send %v to redis-server pid %d: %w", sig, p.cmd.Process.Pid, err)
	}
	return nil
}

// wait waits up to timeout for the process to exit.
func (p *proc) wait(timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// Start starts a redis-server on a free 127.0.0.1 port with its own temporary
// directory (t.TempDir()) and no persistence (--save "" --appendonly no).
// args are appended to the command line and so override those defaults, for
// example Start(t, "--appendonly", "yes"). Start waits until the server
// answers PING and registers t.Cleanup to stop it. It calls Require first, so
// the test is skipped when redis-server is not installed.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return start(t, false, args)
}

// start is Start; with bus set it also picks a free cluster bus port and
// passes it as --cluster-port, since the default, port+10000, may be taken or
// above 65535.
func start(t testing.TB, bus bool, args []string) *Server {
	t.Helper()
	return startProcess(t, bus, "", args)
}

// startProcess is start; with a non-empty sentinelConf it starts a
// redis-sentinel instead, whose configuration file, written into its
// directory, holds sentinelConf.
func startProcess(t testing.TB, bus bool, sentinelConf string, args []string) *Server {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	s := &Server{
		t:       t,
		dir:     dir,
		logPath: filepath.Join(dir, logFileName),
		extra:   append([]string(nil), args...),
	}
	if sentinelConf != "" {
		// Sentinel rewrites its file as it learns (replicas, other
		// sentinels, a new primary): a Restart keeps what it learned.
		s.sentinelConf = sentinelConfName
		if err := os.WriteFile(filepath.Join(dir, sentinelConfName), []byte(sentinelConf), 0o644); err != nil {
			t.Fatalf("redistest: %v", err)
			return s
		}
	}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(s.Stop)

	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 1; ; attempt++ {
		nports := 1
		if bus {
			nports = 2
		}
		ports, err := freePorts(nports)
		if err != nil {
			t.Fatalf("redistest: %v", err)
			return s
		}
		port := ports[0]
		s.port = port
		if bus {
			s.busPort = ports[1]
		}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		err = s.launchLocked()
		if err == nil {
			return s
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			t.Fatalf("redistest: start redis-server (attempt %d): %v", attempt, err)
			return s
		}
	}
}

// Addr returns the server's address, "127.0.0.1:PORT". It does not change
// across Restart.
func (s *Server) Addr() string { return s.addr }

// Pid returns the process id of the most recently started redis-server
// process; after Stop or Kill it is the id of the process that exited.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// Pause suspends the server with SIGSTOP: connections are still accepted by
// the kernel but no command is answered until Resume. Pausing a paused server
// does nothing.
func (s *Server) Pause() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused {
		return
	}
	p, err := s.runningLocked("pause")
	if err == nil {
		err = p.signal(sigStop)
	}
	if err != nil {
		s.t.Fatalf("redistest: %v", err)
		return
	}
	s.paused = true
	waitStopped(p.cmd.Process.Pid, time.Second)
}

// Resume continues a server suspended by Pause with SIGCONT. Resuming a
// server that is not paused does nothing.
func (s *Server) Resume() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.paused {
		return
	}
	p, err := s.runningLocked("resume")
	if err == nil {
		err = p.signal(sigCont)
	}
	if err != nil {
		s.t.Fatalf("redistest: %v", err)
		return
	}
	s.paused = false
}

// Kill kills the server with SIGKILL and waits for it to exit, simulating a
// crash: nothing is flushed beyond what the server already wrote. Killing a
// server that is not running does nothing.
func (s *Server) Kill() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.killLocked(); err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
}

// Stop shuts the server down gracefully: it resumes it if paused, sends
// SIGTERM, waits a bounded time and falls back to SIGKILL. Stopping a server
// that is not running does nothing. Start registers Stop with t.Cleanup.
func (s *Server) Stop() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
}

// Restart starts the server again on the same port with the same directory
// and arguments, so data persisted there (for example with --appendonly yes)
// is loaded again, and waits until it answers PING. A running server is
// stopped first, as by Stop.
func (s *Server) Restart() {
	s.t.Helper()
	s.RestartWith()
}

// RestartWith is Restart with args appended to the server's arguments for
// this process only (for example "--key-load-delay", "1000", a slow load
// of its data); a later Restart uses the arguments the server started
// with.
func (s *Server) RestartWith(args ...string) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	extra := s.extra
	s.extra = append(append([]string(nil), extra...), args...)
	defer func() { s.extra = extra }()
	if err := s.stopLocked(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
		return
	}
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err = s.launchLocked(); !errors.Is(err, errAddrInUse) {
			break
		}
		time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("redistest: restart redis-server on %s: %v", s.addr, err)
	}
}

// Do sends one command to the server over a new connection with a 2 second
// deadline and returns the reply rendered as text: simple strings, bulk
// strings and integers as their text, nil as "", and arrays as their elements
// joined by newlines (nested error elements are rendered as their message).
// An error reply is returned as a Go error whose message is the server's, for
// example "NOSCRIPT No matching script. ...". A timeout is reported with an
// error that satisfies errors.Is(err, os.ErrDeadlineExceeded).
func (s *Server) Do(args ...string) (string, error) {
	return do(s.addr, doTimeout, args...)
}

// runningLocked returns the running process or an error naming op.
func (s *Server) runningLocked(op string) (*proc, error) {
	if s.p == nil || s.p.exited() {
		return nil, fmt.Errorf("cannot %s redis-server on %s: it is not running", op, s.addr)
	}
	return s.p, nil
}

func (s *Server) killLocked() error {
	p := s.p
	if p == nil {
		return nil
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if !p.wait(killTimeout) {
		return fmt.Errorf("redis-server pid %d did not exit within %v of SIGKILL", p.cmd.Process.Pid, killTimeout)
	}
	s.p = nil
	s.paused = false
	return nil
}

func (s *Server) stopLocked() error {
	p := s.p
	if p == nil {
		return nil
	}
	if !p.exited() {
		if s.paused {
			if err := p.signal(sigCont); err != nil {
				return err
			}
			s.paused = false
		}
		if err := p.signal(syscall.SIGTERM); err != nil {
			return err
		}
		if !p.wait(stopTimeout) {
			s.t.Logf("redistest: redis-server pid %d did not exit within %v of SIGTERM; killing it", p.cmd.Process.Pid, stopTimeout)
		}
	}
	return s.killLocked()
}

// launchLocked starts a process on s.port and waits until it is ready. On
// failure the process is gone and the error includes the tail of its output;
// it wraps errAddrInUse when the port was taken.
func (s *Server) launchLocked() error {
	argv := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		// The process runs in s.dir, so the path never has to be quoted.
		"--dir", ".",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "",
	}
	if s.busPort != 0 {
		argv = append(argv, "--cluster-port", strconv.Itoa(s.busPort))
	}
	argv = append(argv, s.extra...)
	bin := serverBinary
	if s.sentinelConf != "" {
		bin = sentinelBinary
		argv = append([]string{s.sentinelConf}, argv...) // the file comes first
	}

	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log file: %w", err)
	}
	defer f.Close() // the child has its own copy
	off, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("seek log file: %w", err)
	}
	fmt.Fprintf(f, "=== redistest: %s %s\n", bin, strings.Join(quoteArgs(argv), " "))

	cmd := exec.Command(bin, argv...)
	cmd.Dir = s.dir
	cmd.Stdout = f // an *os.File, so exec starts no copying goroutines
	cmd.Stderr = f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), logOff: off}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.p = p
	s.pid = cmd.Process.Pid
	s.paused = false

	if err := s.waitReady(p); err != nil {
		if kerr := s.killLocked(); kerr != nil {
			err = fmt.Errorf("%w (and %v)", err, kerr)
		}
		tail := s.logTail(p.logOff)
		if !errors.Is(err, errAddrInUse) && strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w: %w", errAddrInUse, err)
		}
		return fmt.Errorf("%w\n--- %s ---\n%s", err, s.logPath, tail)
	}
	return nil
}

// waitReady polls until p answers PING and INFO confirms that the server on
// s.addr is p and not some other process that owns the port.
func (s *Server) waitReady(p *proc) error {
	pid := p.cmd.Process.Pid
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for {
		if p.exited() {
			return fmt.Errorf("redis-server pid %d exited before answering PING: %v", pid, p.err)
		}
		reply, err := do(s.addr, probeTimeout, "PING")
		if err == nil && reply != "PONG" {
			err = fmt.Errorf("PING replied %q", reply)
		}
		if err == nil {
			info, err := do(s.addr, probeTimeout, "INFO", "server")
			if err == nil {
				if strings.Contains(info, "process_id:"+strconv.Itoa(pid)+"\r\n") {
					return nil
				}
				return fmt.Errorf("%w: another redis-server answers on %s, not pid %d", errAddrInUse, s.addr, pid)
			}
			lastErr = err
		} else {
			lastErr = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server pid %d did not answer PING on %s within %v: %v", pid, s.addr, readyTimeout, lastErr)
		}
		time.Sleep(pollInterval)
	}
}

// logTail returns the end of the log file from offset off.
func (s *Server) logTail(off int64) string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if off > int64(len(data)) {
		off = 0
	}
	data = data[off:]
	if len(data) > logTailBytes {
		data = data[len(data)-logTailBytes:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return strings.TrimRight(string(data), "\n")
}

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		// Closed only after all are open, so the ports are distinct.
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func quoteArgs(args []string) []string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return q
}

// replyError is an error reply from the server.
type replyError string

func (e replyError) Error() string { return string(e) }

// do sends one command to addr over a new connection and renders the reply.
func do(addr string, timeout time.Duration, args ...string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("redistest: Do needs a command")
	}
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("redistest: %s: %w", args[0], err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return "", fmt.Errorf("redistest: %s: %w", args[0], err)
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&buf, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return "", fmt.Errorf("redistest: %s: %w", args[0], err)
	}
	reply, err := readReply(bufio.NewReader(conn))
	var re replyError
	if errors.As(err, &re) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("redistest: %s: %w", args[0], err)
	}
	return reply, nil
}

// readReply reads one RESP2 (or RESP3) reply and renders it as text. An error
// reply at the top level is returned as a replyError.
func readReply(r *bufio.Reader) (string, error) {
	line, err := readLine(r)
	if err != nil {
		return "", err
	}
	if line == "" {
		return "", errors.New("empty reply line")
	}
	kind, rest := line[0], line[1:]
	switch kind {
	case '+', ':', ',', '(':
		return rest, nil
	case '-':
		return "", replyError(rest)
	case '_':
		return "", nil
	case '#':
		if rest == "t" {
			return "1", nil
		}
		return "0", nil
	case '$', '=', '!':
		n, err := strconv.Atoi(rest)
		if err != nil {
			return "", fmt.Errorf("bad bulk length %q", line)
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		s := string(buf[:n])
		switch kind {
		case '=':
			if len(s) >= 4 {
				s = s[4:] // "txt:" prefix of a verbatim string
			}
		case '!':
			return "", replyError(s)
		}
		return s, nil
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(rest)
		if err != nil {
			return "", fmt.Errorf("bad aggregate length %q", line)
		}
		if n < 0 {
			return "", nil
		}
		if kind == '%' || kind == '|' {
			n *= 2
		}
		elems := make([]string, 0, n)
		for range n {
			e, err := readReply(r)
			var re replyError
			if errors.As(err, &re) {
				e, err = string(re), nil
			}
			if err != nil {
				return "", err
			}
			elems = append(elems, e)
		}
		if kind == '|' { // attributes precede the actual reply
			return readReply(r)
		}
		return strings.Join(elems, "\n"), nil
	default:
		return "", fmt.Errorf("unexpected reply %q", line)
	}
}

func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
}
