package redistest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// proxyDelay is long enough that a delayed command is certainly not applied
// before the checks that follow its sending.
const proxyDelay = 500 * time.Millisecond

// rawConn is a client connection that writes commands and reads replies
// separately, so a test controls when each is sent.
type rawConn struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, conn: c, r: bufio.NewReader(c)}
}

// send writes one command without waiting for its reply.
func (c *rawConn) send(args ...string) {
	c.t.Helper()
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&buf, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.conn.Write(buf.Bytes()); err != nil {
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

// eventually polls GET key on s until it returns want, for up to 5s.
func eventually(t *testing.T, s *Server, key, want string) {
	t.Helper()
	var got string
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, err = s.Do("GET", key); err == nil && got == want {
			return
		}
	}
	t.Fatalf("GET %s: got %q (%v), want %q", key, got, err, want)
}

// connectedClients returns the server's connected_clients, counting the
// connection that asks.
func connectedClients(t *testing.T, s *Server) string {
	t.Helper()
	info, err := s.Do("INFO", "clients")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			return v
		}
	}
	t.Fatalf("no connected_clients in %q", info)
	return ""
}

func TestProxyForwards(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := StartProxy(t, s.Addr())
	if host, _, err := net.SplitHostPort(p.Addr()); err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr() = %q", p.Addr())
	}
	c := dialRaw(t, p.Addr())
	for i := range 100 {
		v := strings.Repeat("x", i*1000) // replies and requests of many sizes
		c.send("SET", "k", v)
		if got := c.reply(); got != "OK" {
			t.Fatalf("SET: %q", got)
		}
		c.send("GET", "k")
		if got := c.reply(); got != v {
			t.Fatalf("GET: got %d bytes, want %d", len(got), len(v))
		}
	}
	// Do through the proxy works as well: Do's own connection is proxied.
	if got, err := do(p.Addr(), doTimeout, "PING"); err != nil || got != "PONG" {
		t.Fatalf("PING through the proxy: %q, %v", got, err)
	}
}

// A command delayed on one connection is overtaken by a later command on a
// new connection: the server applies them in the opposite order.
func TestProxyDelayReordersConnections(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := StartProxy(t, s.Addr())
	a := dialRaw(t, p.Addr())
	b := dialRaw(t, p.Addr())

	p.SetDelay(proxyDelay)
	a.send("SET", "k", "first")
	time.Sleep(20 * time.Millisecond) // the proxy has read it with the delay
	p.SetDelay(0)
	b.send("SET", "k", "second")
	if got := b.reply(); got != "OK" {
		t.Fatalf("SET second: %q", got)
	}
	if got, _ := s.Do("GET", "k"); got != "second" {
		t.Fatalf("GET k before the delayed SET is due: got %q, want %q", got, "second")
	}
	if got := a.reply(); got != "OK" {
		t.Fatalf("SET first: %q", got)
	}
	mustDo(t, s, "first", "GET", "k") // the earlier command was applied last
}

// Within one connection, a later undelayed command waits for an earlier
// delayed one.
func TestProxyDelayKeepsOrderInConnection(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := StartProxy(t, s.Addr())
	c := dialRaw(t, p.Addr())

	p.SetDelay(proxyDelay)
	c.send("SET", "k", "first")
	time.Sleep(20 * time.Millisecond)
	p.SetDelay(0)
	c.send("SET", "k", "second")
	time.Sleep(50 * time.Millisecond)
	mustDo(t, s, "", "GET", "k") // neither has arrived: the second waits for the first
	for range 2 {
		if got := c.reply(); got != "OK" {
			t.Fatalf("SET: %q", got)
		}
	}
	mustDo(t, s, "second", "GET", "k")
}

// A client that closes its connection with delayed bytes pending still has
// them delivered when due, and only then is the upstream connection closed.
func TestProxyDeliversAfterClientClose(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := StartProxy(t, s.Addr())
	c := dialRaw(t, p.Addr())
	c.send("PING")
	if got := c.reply(); got != "PONG" {
		t.Fatalf("PING: %q", got)
	}
	if got := connectedClients(t, s); got != "2" { // c's upstream connection and Do's
		t.Fatalf("connected_clients = %s, want 2", got)
	}

	p.SetDelay(proxyDelay)
	c.send("SET", "k", "late")
	c.conn.Close()
	time.Sleep(50 * time.Millisecond)
	mustDo(t, s, "", "GET", "k")
	if got := connectedClients(t, s); got != "2" {
		t.Errorf("connected_clients = %s while bytes are pending, want 2: the upstream connection was closed early", got)
	}
	eventually(t, s, "k", "late")
	for deadline := time.Now().Add(5 * time.Second); connectedClients(t, s) != "1"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("upstream connection still open after the pending bytes were delivered")
		}
	}
}

// Close drops bytes that are not yet due, closes client connections and
// returns; closing again does nothing.
func TestProxyCloseDropsPending(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := StartProxy(t, s.Addr())
	c := dialRaw(t, p.Addr())
	p.SetDelay(proxyDelay)
	c.send("SET", "k", "dropped")
	time.Sleep(20 * time.Millisecond)
	p.Close()
	p.Close()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.r.ReadByte(); err == nil {
		t.Fatal("client connection still open after Close")
	}
	time.Sleep(proxyDelay + 100*time.Millisecond)
	mustDo(t, s, "", "GET", "k")
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("proxy still accepts connections after Close")
	}
}

// The upstream going away closes the client's connection.
func TestProxyUpstreamGone(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := StartProxy(t, s.Addr())
	c := dialRaw(t, p.Addr())
	c.send("PING")
	if got := c.reply(); got != "PONG" {
		t.Fatalf("PING: %q", got)
	}
	s.Kill()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.r.ReadByte(); err == nil {
		t.Fatal("client connection still open after the server died")
	}
	// A new connection is accepted and closed, as the upstream refuses.
	c2 := dialRaw(t, p.Addr())
	c2.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c2.r.ReadByte(); err == nil {
		t.Fatal("client connection open without an upstream")
	}
}

// SetReplyDelay holds back the server's replies, not the commands: the
// server has applied a command while its reply is still on its way, and
// Close drops a reply that is not yet due.
func TestProxyReplyDelay(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := StartProxy(t, s.Addr())
	c := dialRaw(t, p.Addr())
	p.SetReplyDelay(proxyDelay)
	start := time.Now()
	c.send("SET", "k", "v")
	eventually(t, s, "k", "v")
	if got := c.reply(); got != "OK" {
		t.Fatalf("SET: got %q, want OK", got)
	}
	if took := time.Since(start); took < proxyDelay {
		t.Errorf("reply came after %v, want at least the reply delay %v", took, proxyDelay)
	}

	c.send("SET", "k", "w")
	eventually(t, s, "k", "w")
	p.Close()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := c.r.ReadByte(); err == nil {
		t.Fatalf("read %q after Close, want the pending reply dropped and the connection closed", b)
	}
}

// Replies keep their order within a connection, and SetReplyDelay(0) makes
// later ones immediate again.
func TestProxyReplyDelayKeepsOrder(t *testing.T) {
	t.Parallel()
	s := Start(t)
	p := StartProxy(t, s.Addr())
	c := dialRaw(t, p.Addr())
	p.SetReplyDelay(proxyDelay / 5)
	for i := range 5 {
		c.send("ECHO", fmt.Sprint(i))
	}
	p.SetReplyDelay(0)
	c.send("ECHO", "5")
	for i := range 6 {
		if got := c.reply(); got != fmt.Sprint(i) {
			t.Fatalf("reply %d: got %q, want %q", i, got, fmt.Sprint(i))
		}
	}
}
