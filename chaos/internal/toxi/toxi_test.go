package toxi

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/netlock-go/netlock/internal/redistest"
)

func TestMain(m *testing.M) {
	var opts []goleak.Option
	for _, fn := range Leaks { // toxiproxy's own goroutines, see there
		opts = append(opts, goleak.IgnoreAnyFunction(fn))
	}
	goleak.VerifyTestMain(m, opts...)
}

// doTimeout bounds a command that should answer at once.
const doTimeout = 2 * time.Second

func TestToxiproxy(t *testing.T) {
	s := redistest.Start(t)
	x := New(t)
	p := x.Proxy(s.Addr())
	if got, err := do(p.Addr(), doTimeout, "PING"); err != nil || got != "PONG" {
		t.Fatalf("PING through the proxy: got %q, %v", got, err)
	}

	t.Run("latency", func(t *testing.T) {
		if err := p.Add("slow", Latency("upstream", 300, 0)); err != nil {
			t.Fatal(err)
		}
		// A reply slower than the deadline times out: the bytes are late.
		if _, err := do(p.Addr(), 100*time.Millisecond, "PING"); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("PING with 300ms latency and a 100ms deadline: got %v, want a timeout", err)
		}
		if got, err := do(p.Addr(), 2*time.Second, "PING"); err != nil || got != "PONG" {
			t.Errorf("PING with 300ms latency and a 2s deadline: got %q, %v", got, err)
		}
		p.Remove("slow")
	})

	t.Run("blackhole and cut", func(t *testing.T) {
		c := dialRaw(t, p.Addr())
		c.send("PING")
		if got := c.reply(); got != "PONG" {
			t.Fatalf("PING: got %q", got)
		}
		if err := p.Add("hole", Blackhole("upstream")); err != nil {
			t.Fatal(err)
		}
		c.send("SET", "k", "lost")
		c.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := readReply(c.r); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("reply through a blackhole: got %v, want a timeout", err)
		}
		if err := p.Cut("hole"); err != nil {
			t.Fatal(err)
		}
		c.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := readReply(c.r); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read after Cut: got %v, want the connection closed", err)
		}
		if got, _ := s.Do("EXISTS", "k"); got != "0" {
			t.Errorf("a command sent into the blackhole reached the server")
		}
		if got, err := do(p.Addr(), doTimeout, "PING"); err != nil || got != "PONG" {
			t.Errorf("PING through the proxy after Cut: got %q, %v", got, err)
		}
	})

	t.Run("cut keeps the toxics not removed", func(t *testing.T) {
		if err := p.Add("slow", Latency("upstream", 300, 0)); err != nil {
			t.Fatal(err)
		}
		if err := p.Add("hole", Blackhole("upstream")); err != nil {
			t.Fatal(err)
		}
		if err := p.Cut("hole"); err != nil {
			t.Fatal(err)
		}
		if _, err := do(p.Addr(), 100*time.Millisecond, "PING"); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("PING after a cut that kept 300ms of latency, with a 100ms deadline: got %v, want a timeout", err)
		}
		if got, err := do(p.Addr(), 2*time.Second, "PING"); err != nil || got != "PONG" {
			t.Errorf("PING after a cut that removed the blackhole: got %q, %v", got, err)
		}
		p.Remove("slow")
		if got, err := do(p.Addr(), 100*time.Millisecond, "PING"); err != nil || got != "PONG" {
			t.Errorf("PING once the latency is removed, with a 100ms deadline: got %q, %v", got, err)
		}
	})

	t.Run("reset", func(t *testing.T) {
		if err := p.Add("reset", ResetPeer("upstream", 0)); err != nil {
			t.Fatal(err)
		}
		defer p.Remove("reset")
		if _, err := do(p.Addr(), doTimeout, "PING"); err == nil {
			t.Error("PING through reset_peer: got a reply, want the connection closed")
		}
	})

	t.Run("closed mid-reply", func(t *testing.T) {
		big := strings.Repeat("x", 10000)
		if _, err := s.Do("SET", "big", big); err != nil {
			t.Fatal(err)
		}
		if err := p.Add("limit", LimitData("downstream", 100)); err != nil {
			t.Fatal(err)
		}
		defer p.Remove("limit")
		_, err := do(p.Addr(), doTimeout, "GET", "big")
		if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			t.Errorf("GET of 10kB cut after 100 bytes: got %v, want an unexpected EOF", err)
		}
	})
}

// TestStall checks that a stall holds back what a client sends, on its
// connection and on new ones, across a toxic added and removed meanwhile,
// and delivers it, in order, once resumed.
func TestStall(t *testing.T) {
	s := redistest.Start(t)
	p := New(t).Proxy(s.Addr())
	c := dialRaw(t, p.Addr())
	c.send("PING")
	if got := c.reply(); got != "PONG" {
		t.Fatalf("PING: got %q", got)
	}
	p.Stall()
	c.send("SET", "k", "1")
	c.send("INCR", "k")
	held := func(when string) {
		t.Helper()
		time.Sleep(100 * time.Millisecond)
		if got, _ := s.Do("EXISTS", "k"); got != "0" {
			t.Fatalf("%s: a command sent in the stall reached the server", when)
		}
	}
	held("stalled")
	// toxiproxy interrupts the stall to put a toxic after it, and again
	// to take it away.
	if err := p.Add("slow", Latency("upstream", 10, 0)); err != nil {
		t.Fatal(err)
	}
	held("a toxic added")
	p.Remove("slow")
	held("the toxic removed")
	if _, err := do(p.Addr(), 200*time.Millisecond, "PING"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("PING on a new connection in the stall: got %v, want a timeout", err)
	}
	p.Resume()
	if got := c.reply(); got != "OK" {
		t.Errorf("SET held by the stall: got %q", got)
	}
	if got := c.reply(); got != "2" {
		t.Errorf("INCR held by the stall, after the SET: got %q", got)
	}
	if got, err := do(p.Addr(), doTimeout, "PING"); err != nil || got != "PONG" {
		t.Errorf("PING once resumed: got %q, %v", got, err)
	}
}

// TestToxicsAfterAConnectionEnds changes toxics while a connection through
// the proxy ends with bytes held back: a client, its link slowed and then
// stalled, closes a connection whose last request the stall holds; the
// slowing is removed, the stall ends, and a new toxic is added. With the
// stall a latency toxic added after the slowing and removed before the
// next toxic is added, toxiproxy panics here (see Proxy).
func TestToxicsAfterAConnectionEnds(t *testing.T) {
	s := redistest.Start(t)
	p := New(t).Proxy(s.Addr())
	c := dialRaw(t, p.Addr())
	c.send("PING")
	if got := c.reply(); got != "PONG" {
		t.Fatalf("PING: got %q", got)
	}
	if err := p.Add("slow", Latency("upstream", 20, 0)); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	c.send("PING")
	time.Sleep(100 * time.Millisecond) // held by the stall
	c.conn.Close()
	time.Sleep(100 * time.Millisecond) // the end of its stream reaches the stall
	p.Remove("slow")
	p.Resume()
	if err := p.Add("next", Latency("upstream", 300, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := do(p.Addr(), 100*time.Millisecond, "PING"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("PING with the new toxic's 300ms latency and a 100ms deadline: got %v, want a timeout", err)
	}
	p.Remove("next")
	if got, err := do(p.Addr(), doTimeout, "PING"); err != nil || got != "PONG" {
		t.Errorf("PING once every toxic is removed: got %q, %v", got, err)
	}
}

// errorsTB records the errors reported to it instead of failing the test.
type errorsTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (e *errorsTB) Errorf(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

// TestRemoveLastFirst checks that Remove takes toxics off last first only.
func TestRemoveLastFirst(t *testing.T) {
	s := redistest.Start(t)
	tb := &errorsTB{TB: t}
	p := New(tb).Proxy(s.Addr())
	if err := p.Add("first", Latency("upstream", 300, 0)); err != nil {
		t.Fatal(err)
	}
	if err := p.Add("second", Latency("upstream", 1, 0)); err != nil {
		t.Fatal(err)
	}
	p.Remove("first")
	if len(tb.errs) != 1 {
		t.Errorf("removing the first of two toxics: got errors %q, want one", tb.errs)
	}
	p.Remove("second")
	if _, err := do(p.Addr(), 100*time.Millisecond, "PING"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("PING with the first toxic's 300ms latency left on and a 100ms deadline: got %v, want a timeout", err)
	}
	p.Remove("first")
	if got, err := do(p.Addr(), doTimeout, "PING"); err != nil || got != "PONG" {
		t.Errorf("PING once both toxics are removed: got %q, %v", got, err)
	}
	if len(tb.errs) != 1 {
		t.Errorf("removing toxics last first: got errors %q", tb.errs[1:])
	}
}

// rawConn is a client connection that writes commands and reads replies
// separately, so a test controls when each is sent.
type rawConn struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, doTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, conn: c, r: bufio.NewReader(c)}
}

// send writes one command without waiting for its reply.
func (c *rawConn) send(args ...string) {
	c.t.Helper()
	if _, err := c.conn.Write(command(args)); err != nil {
		c.t.Fatalf("send %q: %v", args, err)
	}
}

// reply reads one reply, failing the test if none comes within 5s.
func (c *rawConn) reply() string {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	s, err := readReply(c.r)
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	return s
}

// do sends one command to addr over a new connection and returns its reply,
// all within timeout.
func do(addr string, timeout time.Duration, args ...string) (string, error) {
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(deadline)
	if _, err := conn.Write(command(args)); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

// command encodes args as a RESP array of bulk strings.
func command(args []string) []byte {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&buf, "$%d\r\n%s\r\n", len(a), a)
	}
	return buf.Bytes()
}

// readReply reads one RESP2 reply of the kinds these tests get: a status,
// an error, an integer or a bulk string. A bulk string cut short is
// io.ErrUnexpectedEOF.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch kind, rest := line[0], line[1:]; kind {
	case '+', ':':
		return rest, nil
	case '-':
		return "", errors.New(rest)
	case '$':
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
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}
