package main

import (
	"flag"
	"strings"
	"testing"
)

// TestRedisFlags checks the addresses resolve takes from the flags and the
// environment.
func TestRedisFlags(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		env   map[string]string
		want  string // addresses, comma-separated, or the error
	}{
		{nil, nil, "127.0.0.1:6379"},
		{nil, map[string]string{envRedis: "10.0.0.1:6379"}, "10.0.0.1:6379"},
		{nil, map[string]string{envRedis: " a:1 ,b:2,c:3 "}, "a:1,b:2,c:3"},
		{[]string{"--redis", "x:1"}, map[string]string{envRedis: "a:1"}, "x:1"},
		{[]string{"--redis", "x:1", "--redis", "[::1]:2"}, nil, "x:1,[::1]:2"},
		{nil, map[string]string{envRedis: "a:1,,b:2"}, `$NETLOCK_REDIS: "" is not host:port, such as 127.0.0.1:6379`},
		{nil, map[string]string{envRedis: "a:1,a:1"}, "$NETLOCK_REDIS: a:1 given twice; a quorum needs independent servers"},
		{[]string{"--redis", ":6379"}, nil, `--redis: ":6379" is not host:port, such as 127.0.0.1:6379`},
		{[]string{"--redis", "a:0"}, nil, `--redis: "a:0" is not host:port, such as 127.0.0.1:6379`},
	} {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			var cf connFlags
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			cf.register(fs)
			if err := fs.Parse(tc.flags); err != nil {
				t.Fatal(err)
			}
			c, err := cf.resolve(func(k string) string { return tc.env[k] })
			got := ""
			if err != nil {
				got = err.Error()
			} else {
				got = strings.Join(c.addrs, ",")
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
