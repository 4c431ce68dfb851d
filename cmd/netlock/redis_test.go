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
		{"wrong password", "alice", []string{envPassword + "=guess"}, exitUsage, "WRONGPASS"},
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
	if code, _, stderr := runNetlock(t, nil, "run", "--redis", s.Addr(), "job", "--", "true"); code != exitUsage || !strings.Contains(stderr, "NOAUTH") {
		t.Errorf("without a password: exit %d, want %d with NOAUTH; stderr %q", code, exitUsage, stderr)
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

	for _, tc := range []struct {
		flags []string
		error string
	}{
		{[]string{"--tls"}, "certificate signed by unknown authority"},
		{nil, ""}, // plain text to a TLS port: the server drops the connection
	} {
		code, _, stderr := runNetlock(t, nil, append(append([]string{"run", "--redis", addr}, tc.flags...), "job", "--", "true")...)
		if code != exitUsage || !strings.Contains(stderr, `netlock run: cannot take the lock "job" on Redis at `+addr) || !strings.Contains(stderr, tc.error) {
			t.Errorf("run %v: exit %d, want %d and an error saying %q; stderr %q", tc.flags, code, exitUsage, tc.error, stderr)
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
