package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A server is a redis-server process started by startServer: it listens on a
// free 127.0.0.1 port, persists nothing, and keeps its log in its own
// temporary directory. stop ends it by its pid.
type server struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

const (
	serverReadyTimeout = 10 * time.Second
	serverStopTimeout  = 5 * time.Second
	serverAttempts     = 5
)

// startServer starts one redis-server. It retries on another port if the
// chosen one was taken between probing it and the server binding it.
func startServer(args ...string) (*server, error) {
	var err error
	for range serverAttempts {
		var s *server
		if s, err = tryStartServer(args); err == nil {
			return s, nil
		}
		if !errors.Is(err, errAddrInUse) {
			return nil, err
		}
	}
	return nil, err
}

var errAddrInUse = errors.New("address already in use")

func tryStartServer(args []string) (*server, error) {
	port, err := freePort()
	for err == nil && slices.Contains(args, "--cluster-enabled") && !busPortFree(port) {
		port, err = freePort() // a Cluster node listens on port+10000 too
	}
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "netlock-bench-redis-")
	if err != nil {
		return nil, err
	}
	logFile := filepath.Join(dir, "redis.log")
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--logfile", logFile,
	)
	cmd.Args = append(cmd.Args, args...)
	// Own process group (a terminal's ^C reaches only us, and we stop the
	// server ourselves) and, on Linux, killed if this process dies.
	cmd.SysProcAttr = serverSysProcAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(); err != nil {
		log, _ := os.ReadFile(logFile)
		s.stop()
		if strings.Contains(string(log), "Address already in use") {
			return nil, errAddrInUse
		}
		return nil, fmt.Errorf("redis-server on %s: %w\n%s", s.addr, err, tail(log, 2048))
	}
	return s, nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls the server with PING until it answers PONG.
func (s *server) waitReady() error {
	deadline := time.Now().Add(serverReadyTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("exited before it was ready")
		default:
		}
		if pingOnce(s.addr) == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v", serverReadyTimeout)
}

func pingOnce(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// stop ends the server by its pid: SIGTERM, then SIGKILL if it has not
// exited in time. It removes the server's directory.
func (s *server) stop() {
	defer os.RemoveAll(s.dir)
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return
	case <-time.After(serverStopTimeout):
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// redisServerVersion returns the first line of `redis-server --version`.
func redisServerVersion() string {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// busPortFree reports whether port's cluster bus port, port+10000, exists
// and is free now.
func busPortFree(port int) bool {
	if port+clusterBusOffset > 65535 {
		return false
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+clusterBusOffset)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
