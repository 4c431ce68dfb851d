package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
)

// TestBadFlagValues: every flag's bad value gets one message, naming the
// flag and the value and saying what the flag takes, with exit 64.
func TestBadFlagValues(t *testing.T) {
	t.Setenv(envRedis, "")
	t.Setenv(envPassword, "")
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	const (
		wantWait     = "want a duration of 0 or more, such as 0, 30s or 1m30s"
		wantExpiry   = "want a duration of at least 100ms, such as 8s, 30s or 1m30s"
		wantExitCode = "want a whole number from 0 to 255"
		wantBool     = "want true or false"
		wantPrefix   = "want no '{' or '}', which netlock puts around the lock name"
		wantAddr     = "want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL"
		wantWorkers  = "want a whole number from 1 to 10000"
		wantProcs    = "want a whole number from 1 up"
		wantIncr     = "want a whole number from 1 to 100000"
		wantPause    = "want a duration from 0 to 10s, such as 1ms or 2s"
		wantBackend  = "want redigo, rueidis or goredis"
		wantMissing  = "cannot read it: no such file or directory"
		wantNotPEM   = "want a file of PEM certificates; it holds none"
		wantHolder   = "want at most 256 bytes of printable UTF-8 (no newline or tab)"
	)
	type value struct{ value, want string }
	for _, tc := range []struct {
		cmd    string
		flag   string // as netlock names it: --name, or -v
		values []value
	}{
		{"run", "--wait", []value{{"soon", wantWait}, {"-1s", wantWait}, {"5", wantWait}, {"", wantWait}}},
		{"run", "--expiry", []value{{"soon", wantExpiry}, {"0", wantExpiry}, {"99ms", wantExpiry}, {"-8s", wantExpiry}}},
		{"run", "--grace", []value{{"soon", wantWait}, {"-1s", wantWait}, {"10", wantWait}}},
		{"run", "--conflict-exit-code", []value{{"x", wantExitCode}, {"-1", wantExitCode}, {"256", wantExitCode}, {"1.5", wantExitCode}, {"0x10", wantExitCode}}},
		{"run", "-v", []value{{"maybe", wantBool}}},
		{"run", "--tls", []value{{"2", wantBool}}},
		{"run", "--elect", []value{{"maybe", wantBool}}},
		{"run", "--prefix", []value{{"a{b", wantPrefix}, {"}", wantPrefix}}},
		{"run", "--redis", []value{{"localhost:", wantAddr}, {"a:b:c", wantAddr}, {"127.0.0.1:99999", wantAddr}, {"", wantAddr}}},
		{"run", "--tls-ca", []value{{missing, wantMissing}, {notPEM, wantNotPEM}}},
		{"run", "--holder", []value{{"a\tb", wantHolder + "; U+0009 at byte 1 is not printable"}, {"web-1\n", wantHolder + "; U+000A at byte 5 is not printable"},
			{strings.Repeat("h", 257), wantHolder + "; it is 257 bytes"}, {"h\xff", wantHolder + "; byte 1 is not UTF-8"}}},
		{"status", "--json", []value{{"maybe", wantBool}}},
		{"status", "--prefix", []value{{"a{", wantPrefix}}},
		{"status", "--redis", []value{{"nope:", wantAddr}}},
		{"status", "--tls-ca", []value{{missing, wantMissing}}},
		{"demo", "--workers", []value{{"0", wantWorkers}, {"-5", wantWorkers}, {"10001", wantWorkers}, {"many", wantWorkers}}},
		{"demo", "--procs", []value{{"0", wantProcs}, {"x", wantProcs}}},
		{"demo", "--increments", []value{{"0", wantIncr}, {"100001", wantIncr}, {"x", wantIncr}}},
		{"demo", "--pause", []value{{"-1ms", wantPause}, {"11s", wantPause}, {"1", wantPause}}},
		{"demo", "--backend", []value{{"go-redis", wantBackend}, {"", wantBackend}}},
		{"demo", "--redis", []value{{"localhost:", wantAddr}}},
		{"demo", "--tls-ca", []value{{missing, wantMissing}}},
	} {
		for _, v := range tc.values {
			t.Run(tc.cmd+" "+tc.flag+"="+v.value, func(t *testing.T) {
				args := []string{tc.cmd, tc.flag + "=" + v.value}
				switch tc.cmd {
				case "run":
					args = append(args, "job", "--", "true")
				case "status":
					args = append(args, "job")
				case "demo":
					if tc.flag == "--tls-ca" {
						args = append(args, "--redis", "127.0.0.1:1")
					}
				}
				code, stdout, stderr := runCmd(t, t.Context(), args...)
				if code != exitUsage {
					t.Errorf("exit %d, want %d", code, exitUsage)
				}
				if stdout != "" {
					t.Errorf("stdout: got %q, want nothing", stdout)
				}
				want := fmt.Sprintf("netlock %s: invalid value %q for %s: %s\nRun \"netlock %s --help\" for usage.\n", tc.cmd, v.value, tc.flag, v.want, tc.cmd)
				if stderr != want {
					t.Errorf("stderr:\ngot  %q\nwant %q", stderr, want)
				}
			})
		}
	}
	// One flag's value checked against another's.
	code, _, stderr := runCmd(t, t.Context(), "demo", "--workers", "2", "--procs", "4")
	if want := `netlock demo: invalid value "4" for --procs: want a whole number from 1 to --workers (2)`; code != exitUsage || !strings.HasPrefix(stderr, want+"\n") {
		t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, exitUsage, want)
	}
}

// TestHolderFlagAgrees: --holder takes what netlock.WithHolderInfo takes,
// and nothing else.
func TestHolderFlagAgrees(t *testing.T) {
	backends := []netlock.Backend{netlock.NewRedigo(&redis.Pool{})} // New does not dial
	for _, s := range []string{
		"", "web-1/4242", "ci job 42: deploy +#%", "ü ß 日本", "\uFFFD", strings.Repeat("h", netlock.MaxHolderInfo),
		strings.Repeat("h", netlock.MaxHolderInfo+1), "a\tb", "a\nb", "\x00", "h\xff", "\u200b", "\u00a0", "a\u2028b",
	} {
		var got string
		flagErr := (&holderValue{p: &got}).Set(s)
		_, newErr := netlock.New("job", backends, netlock.WithHolderInfo(s))
		if (flagErr == nil) != (newErr == nil) {
			t.Errorf("%q: --holder says %v, netlock.New says %v", s, flagErr, newErr)
		}
		if flagErr == nil && got != s {
			t.Errorf("%q: --holder set %q", s, got)
		}
	}
}

// TestHelpDefaults: each flag in a command's --help says its default at
// most once: a usage text that says it already gets none from the flag
// package.
func TestHelpDefaults(t *testing.T) {
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, _ := runCmd(t, t.Context(), c.name, "--help")
			if code != exitOK {
				t.Fatalf("exit %d, want %d", code, exitOK)
			}
			_, flags, ok := strings.Cut(stdout, "\nFlags:\n")
			if !ok {
				t.Fatalf("no Flags: section in\n%s", stdout)
			}
			for _, entry := range strings.Split(flags, "\n  -")[1:] {
				if n := strings.Count(entry, "(default"); n > 1 {
					t.Errorf("--help says the default %d times, want at most 1:\n  -%s", n, entry)
				}
			}
		})
	}
}
