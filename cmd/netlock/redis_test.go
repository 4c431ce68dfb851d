package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// TestAuth: --user and $NETLOCK_PASSWORD reach a server that wants them.
func TestAuth(t *testing.T) {
	// The default user keeps no password, so that redistest can check the
	// server; alice needs hers.
	s := redistest.Start(t, "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all")
	for _, tc := range []struct {
		name  string
		user  string
		env   []string
		code  int
		error string // in stderr
	}{
		{"user and password", "alice", []string{envPassword + "=s3cret"}, 0, ""},
		{"wrong password", "alice", []string{envPassword + "=guess"}, exitUnavailable, "WRONGPASS"},
		{"no password", "alice", nil, exitUsage, "--user alice needs the password in $NETLOCK_PASSWORD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runNetlock(t, tc.env, "run", "--redis", s.Addr(), "--user", tc.user, "job", "--", "echo", "ran")
			if code != tc.code {
				t.Errorf("run: exit %d, want %d", code, tc.code)
			}
			if tc.code == 0 && stdout != "ran\n" {
				t.Errorf("run: the program did not run: stdout %q", stdout)
			}
			if !strings.Contains(stderr, tc.error) {
				t.Errorf("run: stderr does not say %q", tc.error)
			}
			code, _, stderr = runNetlock(t, tc.env, "status", "--redis", s.Addr(), "--user", tc.user, "job")
			if code != tc.code {
				t.Errorf("status: exit %d, want %d", code, tc.code)
			}
			if !strings.Contains(stderr, tc.error) {
				t.Errorf("status: stderr does not say %q", tc.error)
			}
		})
	}
	checkReleased(t, s, "job")

	// The password alone authenticates the default user.
	redisDo(t, s, "CONFIG", "SET", "requirepass", "0ther")
	if code, _, stderr := runNetlock(t, nil, "run", "--redis", s.Addr(), "job", "--", "true"); code != exitUnavailable || !strings.Contains(stderr, "Redis at "+s.Addr()+" answered with an error: NOAUTH") || !strings.Contains(stderr, "put it in $NETLOCK_PASSWORD") {
		t.Errorf("without a password: exit %d, want %d with NOAUTH; stderr %q", code, exitUnavailable, stderr)
	}
	if code, _, _ := runNetlock(t, []string{envPassword + "=0ther"}, "run", "--redis", s.Addr(), "job", "--", "true"); code != 0 {
		t.Errorf("with the password: exit %d, want 0", code)
	}
}

// TestTLS: --tls-ca makes netlock verify the server against that CA; --tls
// alone verifies against the system's roots, which do not know it.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeCerts(t, dir)
	port := freePort(t)
	s := redistest.Start(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", cert, "--tls-key-file", key,
		"--tls-ca-cert-file", ca, "--tls-auth-clients", "no")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	code, stdout, stderr := runNetlock(t, nil, "run", "--redis", addr, "--tls-ca", ca, "job", "--", "sh", "-c",
		`"$1" status --redis "$2" --tls-ca "$3" "$NETLOCK_NAME"`, "sh", netlockBin, addr, ca)
	if code != exitHeld {
		t.Errorf("run with --tls-ca: exit %d, want status's %d; stderr %q", code, exitHeld, stderr)
	}
	if !strings.HasPrefix(stdout, `lock "job": held, fencing token 1`) {
		t.Errorf("status inside the run does not show the lock held:\n%s", stdout)
	}
	checkReleased(t, s, "job")

	rediss := "rediss://" + addr
	code, stdout, stderr = runNetlock(t, nil, "run", "--redis", rediss, "--tls-ca", ca, "job", "--", "sh", "-c",
		`"$1" status --redis "$2" --tls-ca "$3" "$NETLOCK_NAME"`, "sh", netlockBin, rediss, ca)
	if code != exitHeld || !strings.HasPrefix(stdout, `lock "job": held, fencing token 2`) {
		t.Errorf("run with rediss:// and --tls-ca: exit %d, want status's %d, held by token 2; stdout %q, stderr %q", code, exitHeld, stdout, stderr)
	}
	checkReleased(t, s, "job")
	if code, _, stderr := runNetlock(t, nil, "run", "--redis", rediss, "job", "--", "true"); code != exitUnavailable || !strings.Contains(stderr, "certificate signed by unknown authority") {
		t.Errorf("run with rediss:// and no CA: exit %d, want %d with an unknown authority; stderr %q", code, exitUnavailable, stderr)
	}

	for _, tc := range []struct {
		flags []string
		error string
	}{
		{[]string{"--tls"}, "certificate signed by unknown authority"},
		{nil, ""}, // plain text to a TLS port: the server drops the connection
	} {
		code, _, stderr := runNetlock(t, nil, append(append([]string{"run", "--redis", addr}, tc.flags...), "job", "--", "true")...)
		if code != exitUnavailable || !strings.Contains(stderr, `netlock run: cannot take the lock "job"`) || !strings.Contains(stderr, "Redis at "+addr+" not answering: ") || !strings.Contains(stderr, tc.error) {
			t.Errorf("run %v: exit %d, want %d and an error saying %q; stderr %q", tc.flags, code, exitUnavailable, tc.error, stderr)
		}
	}
	if keys := redisDo(t, s, "KEYS", "*"); keys != fenceKey("job") {
		t.Errorf("keys %q, want only the fence counter %s", keys, fenceKey("job"))
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// writeCerts writes a CA and a certificate it signed for 127.0.0.1 into dir,
// and returns the files: the CA's certificate, the server's and its key.
func writeCerts(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "netlock test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caTmpl, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKeyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "PRIVATE KEY", srvKeyDER)
}

// TestRedisFlags checks the servers resolve takes from the flags and the
// environment: each as name network address user password db tls.
func TestRedisFlags(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		env   map[string]string
		want  string // nodes, "; "-separated, or the error
	}{
		{nil, nil, "127.0.0.1:6379 tcp 127.0.0.1:6379 - - 0 -"},
		{nil, map[string]string{envRedis: "10.0.0.1:6379"}, "10.0.0.1:6379 tcp 10.0.0.1:6379 - - 0 -"},
		{nil, map[string]string{envRedis: " a:1 ,b:2,c:3 "}, "a:1 tcp a:1 - - 0 -; b:2 tcp b:2 - - 0 -; c:3 tcp c:3 - - 0 -"},
		{[]string{"--redis", "x:1"}, map[string]string{envRedis: "a:1"}, "x:1 tcp x:1 - - 0 -"},
		{[]string{"--redis", "x:1", "--redis", "[::1]:2"}, nil, "x:1 tcp x:1 - - 0 -; [::1]:2 tcp [::1]:2 - - 0 -"},
		{nil, map[string]string{envRedis: "a:1,,b:2"}, `invalid value "" for $NETLOCK_REDIS: want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL`},
		{nil, map[string]string{envRedis: "a:1,a:1"}, `invalid value "a:1" for $NETLOCK_REDIS: given twice; a quorum needs independent servers`},
		{[]string{"--redis", ":6379"}, nil, `invalid value ":6379" for --redis: want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL`},
		{[]string{"--redis", "a:0"}, nil, `invalid value "a:0" for --redis: want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL`},
		// A host alone is on port 6379, as redis-cli takes it.
		{[]string{"--redis", "localhost"}, nil, "localhost:6379 tcp localhost:6379 - - 0 -"},
		{[]string{"--redis", "10.0.0.1"}, nil, "10.0.0.1:6379 tcp 10.0.0.1:6379 - - 0 -"},
		{[]string{"--redis", "::1"}, nil, "[::1]:6379 tcp [::1]:6379 - - 0 -"},
		{[]string{"--redis", "[::1]"}, nil, "[::1]:6379 tcp [::1]:6379 - - 0 -"},
		{nil, map[string]string{envRedis: "a,b:2"}, "a:6379 tcp a:6379 - - 0 -; b:2 tcp b:2 - - 0 -"},
		{[]string{"--redis", "h", "--redis", "h:6379"}, nil, `invalid value "h:6379" for --redis: given twice; a quorum needs independent servers`},
		{[]string{"--redis", "localhost:"}, nil, `invalid value "localhost:" for --redis: want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL`},
		{[]string{"--redis", "a:b:c"}, nil, `invalid value "a:b:c" for --redis: want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL`},
		{[]string{"--redis", "[::1"}, nil, `invalid value "[::1" for --redis: want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL`},
		{[]string{"--redis", "[h]"}, nil, `invalid value "[h]" for --redis: want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL`},
		{[]string{"--redis", "/run/redis.sock"}, nil, `invalid value "/run/redis.sock" for --redis: want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL`},

		// URLs.
		{[]string{"--redis", "redis://h:7000/3"}, nil, "redis://h:7000/3 tcp h:7000 - - 3 -"},
		{[]string{"--redis", "redis://h"}, nil, "redis://h:6379 tcp h:6379 - - 0 -"},
		{[]string{"--redis", "redis://"}, nil, "redis://localhost:6379 tcp localhost:6379 - - 0 -"},
		{[]string{"--redis", "redis://h/"}, nil, "redis://h:6379 tcp h:6379 - - 0 -"},
		{[]string{"--redis", "redis://h?db=2"}, nil, "redis://h:6379/2 tcp h:6379 - - 2 -"},
		{[]string{"--redis", "redis://alice:s3cret@h:1/2"}, nil, "redis://alice@h:1/2 tcp h:1 alice s3cret 2 -"},
		{[]string{"--redis", "redis://:s3cret@h:1"}, nil, "redis://h:1 tcp h:1 - s3cret 0 -"},
		{[]string{"--redis", "redis://s3cret@h:1"}, nil, "redis://h:1 tcp h:1 - s3cret 0 -"},
		{[]string{"--redis", "redis://alice:@h:1"}, map[string]string{envPassword: "pw"}, "redis://alice@h:1 tcp h:1 alice pw 0 -"},
		{[]string{"--redis", "redis://alice:@h:1"}, nil, `invalid value "redis://alice@h:1" for --redis: names the user alice without a password: give it in the URL or in $NETLOCK_PASSWORD`},
		{[]string{"--redis", "redis://alice:s3cret@h:1", "--user", "bob"}, map[string]string{envPassword: "pw"}, "redis://alice@h:1 tcp h:1 alice s3cret 0 -"},
		{[]string{"--redis", "redis://h:1", "--user", "bob"}, map[string]string{envPassword: "pw"}, "redis://h:1 tcp h:1 bob pw 0 -"},
		{[]string{"--redis", "rediss://h:1/1"}, nil, "rediss://h:1/1 tcp h:1 - - 1 tls"},
		{[]string{"--redis", "redis://h:1", "--tls"}, nil, "redis://h:1 tcp h:1 - - 0 tls"},
		{[]string{"--redis", "unix:///run/redis.sock"}, nil, "unix:///run/redis.sock unix /run/redis.sock - - 0 -"},
		{[]string{"--redis", "unix:///run/redis.sock?db=4", "--tls"}, nil, "unix:///run/redis.sock?db=4 unix /run/redis.sock - - 4 -"},
		{[]string{"--redis", "unix://alice:pw@/run/redis.sock"}, nil, "unix://alice@/run/redis.sock unix /run/redis.sock alice pw 0 -"},
		{[]string{"--redis", "redis://h:1/1", "--redis", "redis://h:1/2"}, nil, `invalid value "redis://h:1/2" for --redis: the same server as redis://h:1/1; a quorum needs independent servers`},
		{[]string{"--redis", "h:1", "--redis", "redis://H:1"}, nil, `invalid value "redis://H:1" for --redis: the same server as h:1; a quorum needs independent servers`},
		{[]string{"--redis", "redis://h:1/x"}, nil, `invalid value "redis://h:1/x" for --redis: database "x" is not a number from 0 up`},
		{[]string{"--redis", "redis://h:1/-1"}, nil, `invalid value "redis://h:1/-1" for --redis: database "-1" is not a number from 0 up`},
		{[]string{"--redis", "redis://h:1/1?db=2"}, nil, `invalid value "redis://h:1/1?db=2" for --redis: the database is given twice, as /1 and db=2`},
		{[]string{"--redis", "redis://h:99999"}, nil, `invalid value "redis://h:99999" for --redis: port "99999" is not a number from 1 to 65535`},
		{[]string{"--redis", "redis://h:1?timeout=3"}, nil, `invalid value "redis://h:1?timeout=3" for --redis: unknown parameter "timeout" (only db)`},
		{[]string{"--redis", "redis://h:1?z=1&db=2&a=3&m=4"}, nil, `invalid value "redis://h:1?z=1&db=2&a=3&m=4" for --redis: unknown parameter "a" (only db)`},
		{[]string{"--redis", "http://h:1"}, nil, `invalid value "http://h:1" for --redis: unknown scheme "http": want redis://, rediss:// or unix://`},
		{[]string{"--redis", "unix://run/redis.sock"}, nil, `invalid value "unix://run/redis.sock" for --redis: want unix:///path/to/socket, with three slashes`},
		{[]string{"--redis", "redis://alice:hunter2@h:1/x"}, nil, `invalid value "redis://alice:xxxxx@h:1/x" for --redis: database "x" is not a number from 0 up`},
		{[]string{"--redis", "redis://hunter2@h:1/x"}, nil, `invalid value "redis://xxxxx@h:1/x" for --redis: database "x" is not a number from 0 up`},
		{[]string{"--redis", "redis://alice:hunter2@h:1/%zz"}, nil, `invalid value "redis://alice:xxxxx@h:1/%zz" for --redis: not a valid URL`},
		{[]string{"--prefix", "a}"}, nil, `invalid value "a}" for --prefix: want no '{' or '}', which netlock puts around the lock name`},
	} {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			var cf connFlags
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			cf.register(fs, false)
			if err := fs.Parse(tc.flags); err != nil {
				t.Fatal(err)
			}
			c, err := cf.resolve(func(k string) string { return tc.env[k] })
			got := ""
			if err != nil {
				got = err.Error()
			} else {
				var nodes []string
				for _, n := range c.nodes {
					tls := "-"
					if n.tls != nil {
						tls = "tls"
					}
					nodes = append(nodes, strings.Join([]string{n.name, n.network, n.address, or(n.user, "-"), or(n.password, "-"), strconv.Itoa(n.db), tls}, " "))
				}
				got = strings.Join(nodes, "; ")
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// or returns s, or def if s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestRedisURL: a database number in a URL, and a unix socket, reach the
// database and the server they name.
func TestRedisURL(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	s := redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700", "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all")
	fence := func(db int) string {
		t.Helper()
		c, err := redis.Dial("tcp", s.Addr(), redis.DialDatabase(db))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		v, _ := redis.String(c.Do("GET", fenceKey("job")))
		return v
	}
	for _, tc := range []struct {
		url string
		db  int
	}{
		{"redis://" + s.Addr() + "/3", 3},
		{"unix://" + sock + "?db=2", 2},
		{"redis://alice:s3cret@" + s.Addr() + "/5", 5},
		{"unix://alice:s3cret@" + sock + "?db=6", 6},
	} {
		t.Run(tc.url, func(t *testing.T) {
			script := `"$1" status --redis "$2" "$NETLOCK_NAME"`
			code, stdout, stderr := runNetlock(t, nil, "run", "--redis", tc.url, "job", "--", "sh", "-c", script, "sh", netlockBin, tc.url)
			if code != exitHeld || !strings.HasPrefix(stdout, `lock "job": held, fencing token 1, TTL `) {
				t.Errorf("status inside the run: exit %d, want %d, and held by token 1:\n%s", code, exitHeld, stdout)
			}
			if strings.Contains(stdout+stderr, "s3cret") {
				t.Errorf("the password shows in the output")
			}
			if got := fence(tc.db); got != "1" {
				t.Errorf("fence counter in database %d: got %q, want 1", tc.db, got)
			}
		})
	}
	if got := fence(0); got != "" {
		t.Errorf("fence counter in database 0: got %q, want none", got)
	}
}

// TestDemoAuth: the demo authenticates as run does, with both clients, on
// TCP and on a unix socket.
func TestDemoAuth(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	s := redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700", "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all")
	for _, backend := range backendNames {
		for _, tc := range []struct {
			name  string
			env   []string
			flags []string
			code  int
			error string
		}{
			{"user and password", []string{envPassword + "=s3cret"}, []string{"--redis", s.Addr(), "--user", "alice"}, 0, ""},
			{"URL", nil, []string{"--redis", "redis://alice:s3cret@" + s.Addr() + "/1"}, 0, ""},
			{"unix socket", nil, []string{"--redis", "unix://alice:s3cret@" + sock + "?db=2"}, 0, ""},
			{"wrong password", []string{envPassword + "=guess"}, []string{"--redis", s.Addr(), "--user", "alice"}, exitUnavailable, "WRONGPASS"},
		} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				args := append([]string{"demo", "--backend", backend, "--workers", "4", "--increments", "2"}, tc.flags...)
				code, stdout, stderr := runNetlock(t, tc.env, args...)
				if code != tc.code || !strings.Contains(stderr, tc.error) {
					t.Errorf("exit %d, want %d, with %q on stderr", code, tc.code, tc.error)
				}
				if tc.code == 0 {
					checkReport(t, stdout, 8)
				}
				if strings.Contains(stdout+stderr, "s3cret") {
					t.Errorf("the password shows in the output")
				}
			})
		}
	}
}
