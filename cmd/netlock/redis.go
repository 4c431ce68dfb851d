package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
)

// Environment variables read by run and status.
const (
	envRedis    = "NETLOCK_REDIS"    // comma-separated addresses, when no --redis is given
	envPassword = "NETLOCK_PASSWORD" // the only way to give a password: never in argv, where ps shows it
	defaultAddr = "127.0.0.1:6379"
)

// connFlags are the flags with which run and status reach Redis, as parsed.
type connFlags struct {
	addrs  addrList
	user   string
	tls    bool
	tlsCA  string
	prefix string
}

// connHelp is the part of the commands' help about reaching Redis.
const connHelp = `Redis: each --redis is one independent deployment (not a replica of
another); with several, the lock is a quorum lock, held when a majority of
them grant it. Without --redis, the addresses come from $NETLOCK_REDIS
(comma-separated), else 127.0.0.1:6379. The password, if any, is read from
$NETLOCK_PASSWORD only, so that it never shows in ps.
`

// register defines the connection flags on fs.
func (c *connFlags) register(fs *flag.FlagSet) {
	fs.Var(&c.addrs, "redis", "Redis server at `host:port`; repeat for a quorum over independent servers\n(default $"+envRedis+", else "+defaultAddr+")")
	fs.StringVar(&c.user, "user", "", "authenticate as the ACL `user` (password from $"+envPassword+")")
	fs.BoolVar(&c.tls, "tls", false, "connect with TLS, verifying the server against the system's roots")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "verify the server against the CA certificates in PEM `file` (implies --tls)")
	fs.StringVar(&c.prefix, "prefix", netlock.DefaultPrefix, "prefix of the lock's Redis keys, as netlock.WithPrefix")
}

// A conn is how to reach the Redis deployments of a lock: validated
// connection flags and environment.
type conn struct {
	addrs     []string
	user      string
	password  string
	tlsConfig *tls.Config // nil without TLS
	prefix    string
}

// resolve validates the flags, fills in the defaults from the environment
// (getenv), and reads the CA file. Its error is a usage error, worded for
// the user.
func (c *connFlags) resolve(getenv func(string) string) (*conn, error) {
	r := &conn{addrs: c.addrs, user: c.user, password: getenv(envPassword), prefix: c.prefix}
	from := "--redis"
	if len(r.addrs) == 0 {
		if env := getenv(envRedis); env != "" {
			from = "$" + envRedis
			for _, a := range strings.Split(env, ",") {
				r.addrs = append(r.addrs, strings.TrimSpace(a))
			}
		} else {
			r.addrs = []string{defaultAddr}
		}
	}
	seen := map[string]bool{}
	for _, a := range r.addrs {
		host, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s: %q is not host:port, such as 127.0.0.1:6379", from, a)
		}
		if seen[a] {
			// Two votes from one server would make the quorum a lie.
			return nil, fmt.Errorf("%s: %s given twice; a quorum needs independent servers", from, a)
		}
		seen[a] = true
	}
	if r.user != "" && r.password == "" {
		return nil, fmt.Errorf("--user %s needs the password in $%s", r.user, envPassword)
	}
	if c.tls || c.tlsCA != "" {
		r.tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if c.tlsCA != "" {
			pem, err := os.ReadFile(c.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			roots := x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca: no PEM certificate in %s", c.tlsCA)
			}
			r.tlsConfig.RootCAs = roots
		}
	}
	return r, nil
}

// pools returns one redigo pool per address. Dialling and AUTH happen when a
// connection is first used, bounded by the context of that use. The caller
// closes the pools.
func (c *conn) pools() []*redis.Pool {
	opts := []redis.DialOption{}
	if c.password != "" {
		opts = append(opts, redis.DialUsername(c.user), redis.DialPassword(c.password))
	}
	if cfg := c.tlsConfig; cfg != nil {
		// tls.Dialer, not redigo's DialUseTLS: its handshake honours the
		// context, so a server that stalls in the handshake costs no more
		// than the node timeout. It takes the server name from the address.
		opts = append(opts, redis.DialContextFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := tls.Dialer{Config: cfg}
			return d.DialContext(ctx, network, addr)
		}))
	}
	pools := make([]*redis.Pool, len(c.addrs))
	for i, addr := range c.addrs {
		pools[i] = &redis.Pool{
			MaxIdle: 2, // the watchdog's extend and the release
			DialContext: func(ctx context.Context) (redis.Conn, error) {
				return redis.DialContext(ctx, "tcp", addr, opts...)
			},
		}
	}
	return pools
}

// where names the nodes for a message: "127.0.0.1:6379", or "node 0
// 10.0.0.1:6379, node 1 10.0.0.2:6379" for a quorum, whose errors name nodes
// by index.
func (c *conn) where() string {
	if len(c.addrs) == 1 {
		return c.addrs[0]
	}
	s := make([]string, len(c.addrs))
	for i, a := range c.addrs {
		s[i] = fmt.Sprintf("node %d %s", i, a)
	}
	return strings.Join(s, ", ")
}

// closePools closes every pool.
func closePools(pools []*redis.Pool) {
	for _, p := range pools {
		p.Close()
	}
}

// addrList is a repeatable flag.
type addrList []string

func (l *addrList) String() string { return strings.Join(*l, ",") }

func (l *addrList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// oneLine joins the lines of a multi-line error (errors.Join) with "; ".
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
