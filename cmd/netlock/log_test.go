package main

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/netlock-go/netlock/internal/redistest"
)

// TestLineHandler: the library's records, as run -v writes them: one
// sentence a line.
func TestLineHandler(t *testing.T) {
	c := &conn{nodes: []node{{name: "10.0.0.1:6379"}, {name: "redis://10.0.0.2:6379/1"}}}
	refused := errors.New("netlock: node 1: dial tcp 10.0.0.2:6379: connect: connection refused")
	for _, tc := range []struct {
		name string
		log  func(l *slog.Logger)
		want string
	}{
		{"lock lost", func(l *slog.Logger) {
			l.Warn("netlock: lock lost", "lock", "job1", "token", uint64(3), "reason", "extend")
		}, "netlock run: lock lost: job1 (token 3, reason extend)\n"},
		{"release not delivered", func(l *slog.Logger) {
			l.Warn("netlock: release not delivered to every node; nothing will send it again (the key expires with its TTL)", "lock", "job1", "token", uint64(3), "error", refused.Error())
		}, "netlock run: release not delivered to every node; nothing will send it again (the key expires with its TTL): job1 (token 3, error node 1: dial tcp 10.0.0.2:6379: connect: connection refused)\n"},
		{"node by address", func(l *slog.Logger) {
			l.Warn("netlock: gave up delivering a release", "lock", "job1", "node", 1, "reason", "final", "error", "NOPERM")
		}, "netlock run: gave up delivering a release: job1 (node redis://10.0.0.2:6379/1, reason final, error NOPERM)\n"},
		{"key words", func(l *slog.Logger) {
			l.Warn("netlock: the server's maxmemory-policy allkeys-lru can evict lock keys", "lock", "job1", "node", 0, "maxmemory_policy", "allkeys-lru", "maxmemory", int64(0))
		}, "netlock run: the server's maxmemory-policy allkeys-lru can evict lock keys: job1 (node 10.0.0.1:6379, maxmemory policy allkeys-lru, maxmemory 0)\n"},
		{"not a Redis server", func(l *slog.Logger) {
			l.Warn("netlock: x", "error", "netlock: node 0: redigo: unexpected response line (possible server error or unsupported concurrent read by application)")
		}, "netlock run: x (error node 0: does not answer as a Redis server (redigo: unexpected response line))\n"},
		{"no attributes", func(l *slog.Logger) { l.Error("netlock: something") }, "netlock run: something\n"},
		{"empty attribute", func(l *slog.Logger) {
			l.LogAttrs(t.Context(), slog.LevelWarn, "netlock: x", slog.Attr{}, slog.Int("n", 1))
		}, "netlock run: x (n 1)\n"},
		{"with attributes and group", func(l *slog.Logger) {
			l.With("lock", "job1").WithGroup("g").With("a", 1).Warn("netlock: x", "b", 2, slog.Group("c", "d", 3))
		}, "netlock run: x: job1 (g.a 1, g.b 2, g.c.d 3)\n"},
		{"below the level", func(l *slog.Logger) { l.Info("netlock: acquire", "lock", "job1") }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			tc.log(slog.New(&lineHandler{prefix: "netlock run: ", w: &b, level: slog.LevelWarn, node: c.nodeNamer()}))
			if got := b.String(); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestRunVerboseLost: run -v writes the library's warning of a lost hold as
// a sentence, not as a slog record.
func TestRunVerboseLost(t *testing.T) {
	s := redistest.Start(t)
	dir := t.TempDir()
	marker, ready := filepath.Join(dir, "marker"), filepath.Join(dir, "ready")
	p := startNetlock(t, nil, "run", "-v", "--redis", s.Addr(), "--expiry", "1s", "job", "--", "sh", "-c", trapScript("TERM"), "sh", marker, ready)
	waitFor(t, "the program to start", func() bool { return exists(ready) })
	redisDo(t, s, "DEL", lockKey("job"))
	if code := p.wait(); code != exitLost {
		t.Errorf("exit %d, want %d", code, exitLost)
	}
	stderr := p.stderr.String()
	if want := "netlock run: lock lost: job (token 1, reason extend)\n"; !strings.Contains(stderr, want) {
		t.Errorf("stderr does not say %q", want)
	}
	if strings.Contains(stderr, "level=") || strings.Contains(stderr, "msg=") {
		t.Errorf("stderr has a slog record: %q", stderr)
	}
}
