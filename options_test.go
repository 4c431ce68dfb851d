package netlock

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

func TestNewRejectsBadInput(t *testing.T) {
	b := NewRedigo(nil) // nil: New names it
	good := newBackend(t, "redigo", miniredis.RunT(t).Addr())
	tests := []struct {
		what     string
		name     string
		backends []Backend
		opts     []Option
		want     string // in the error
	}{
		{"empty name", "", []Backend{good}, nil, "empty lock name"},
		{"name starting with }", "}x", []Backend{good}, nil, `lock name "}x" starts with '}'`},
		{"no backends", "n", nil, nil, "no backends"},
		{"nil backend", "n", []Backend{b}, nil, "backend 0 is nil"},
		{"same backend twice", "n", []Backend{good, good}, nil, "backends 0 and 1 are the same"},
		{"nil backend in a quorum", "n", []Backend{good, b, good}, nil, "backend 1 is nil"},
		{"nil option", "n", []Backend{good}, []Option{nil}, "option 0 is nil"},
		{"zero expiry", "n", []Backend{good}, []Option{WithExpiry(0)}, "expiry 0s is not positive"},
		{"negative expiry", "n", []Backend{good}, []Option{WithExpiry(-time.Second)}, "expiry -1s is not positive"},
		{"sub-ms expiry", "n", []Backend{good}, []Option{WithExpiry(time.Microsecond)}, "below Redis's 1ms resolution"},
		{"expiry eaten by drift", "n", []Backend{good}, []Option{WithExpiry(2 * time.Millisecond)}, "leaves no validity"},
		{"negative drift", "n", []Backend{good}, []Option{WithDriftFactor(-0.1)}, "drift factor -0.1 is outside [0, 0.5)"},
		{"drift 0.5", "n", []Backend{good}, []Option{WithDriftFactor(0.5)}, "drift factor 0.5 is outside"},
		{"NaN drift", "n", []Backend{good}, []Option{WithDriftFactor(math.NaN())}, "drift factor NaN"},
		{"node timeout = expiry", "n", []Backend{good}, []Option{WithExpiry(time.Second), WithNodeTimeout(time.Second)}, "node timeout 1s is not below the expiry 1s"},
		{"node timeout > expiry", "n", []Backend{good}, []Option{WithNodeTimeout(time.Minute)}, "node timeout 1m0s is not below the expiry 8s"},
		{"negative node timeout", "n", []Backend{good}, []Option{WithNodeTimeout(-1)}, "node timeout -1ns is not positive"},
		{"zero min retry", "n", []Backend{good}, []Option{WithRetryDelay(0, time.Second)}, "minimum retry delay 0s is not positive"},
		{"max retry below min", "n", []Backend{good}, []Option{WithRetryDelay(time.Second, time.Millisecond)}, "maximum retry delay 1ms is below the minimum 1s"},
		{"prefix with {", "n", []Backend{good}, []Option{WithPrefix("a{")}, `prefix "a{" contains '{' or '}'`},
		{"prefix with }", "n", []Backend{good}, []Option{WithPrefix("}")}, `prefix "}" contains`},
		{"holder info too long", "n", []Backend{good}, []Option{WithHolderInfo(strings.Repeat("h", MaxHolderInfo+1))}, "holder info is 257 bytes, more than 256"},
		{"holder info with a newline", "n", []Backend{good}, []Option{WithHolderInfo("web-1\nx")}, `holder info "web-1\nx" has a character that is not printable, U+000A at byte 5`},
		{"holder info with a tab", "n", []Backend{good}, []Option{WithHolderInfo("a\tb")}, `holder info "a\tb" has a character that is not printable, U+0009 at byte 1`},
		{"holder info with a NUL", "n", []Backend{good}, []Option{WithHolderInfo("\x00")}, "U+0000 at byte 0"},
		{"holder info not UTF-8", "n", []Backend{good}, []Option{WithHolderInfo("h\xff")}, `holder info "h\xff" is not valid UTF-8 (at byte 1)`},
	}
	for _, tt := range tests {
		t.Run(tt.what, func(t *testing.T) {
			m, err := New(tt.name, tt.backends, tt.opts...)
			if err == nil {
				t.Fatalf("New: got a NetMutex, want an error containing %q", tt.want)
			}
			if m != nil {
				t.Errorf("New: got a NetMutex with the error %v, want nil", err)
			}
			if !strings.HasPrefix(err.Error(), "netlock: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: got error %q, want it to start with \"netlock: \" and contain %q", err, tt.want)
			}
		})
	}
}

func TestNewReportsEveryBadOption(t *testing.T) {
	good := newBackend(t, "redigo", miniredis.RunT(t).Addr())
	_, err := New("n", []Backend{good}, WithDriftFactor(1), WithRetryDelay(-1, -2))
	for _, want := range []string{"drift factor", "minimum retry delay", "maximum retry delay"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: got %v, want it to name %q", err, want)
		}
	}
}

func TestNewDefaults(t *testing.T) {
	good := newBackend(t, "redigo", miniredis.RunT(t).Addr())
	m, err := New("orders:42", []Backend{good})
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() != "orders:42" {
		t.Errorf("Name: got %q, want %q", m.Name(), "orders:42")
	}
	c := m.cfg
	if c.expiry != 8*time.Second || !c.autoExtend || c.driftFactor != 0.01 || c.prefix != "netlock:" || !c.fencing ||
		c.nodeTimeout != 500*time.Millisecond {
		t.Errorf("defaults: got %+v", c)
	}
	if m.keys.lock != "netlock:{orders:42}" || m.keys.channel != "netlock:{orders:42}:released" {
		t.Errorf("keys: got %+v", m.keys)
	}
	short, err := New("n", []Backend{good}, WithExpiry(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if short.cfg.nodeTimeout != 100*time.Millisecond {
		t.Errorf("node timeout for a 1s expiry: got %v, want 100ms", short.cfg.nodeTimeout)
	}
}
