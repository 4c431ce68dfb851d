package redistest

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

func TestToxiproxy(t *testing.T) {
	s := Start(t)
	x := NewToxiproxy(t)
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
