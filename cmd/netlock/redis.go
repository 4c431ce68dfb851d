package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"
	redisv9 "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock"
)

// Environment variables read by run, status and demo.
const (
	envRedis    = "NETLOCK_REDIS"    // comma-separated addresses, when no --redis is given (run, status)
	envPassword = "NETLOCK_PASSWORD" // the password, where the address has none: never in argv, where ps shows it
	defaultAddr = "127.0.0.1:6379"
	defaultPort = "6379"
)

// connFlags are the flags with which the commands reach Redis, as parsed.
type connFlags struct {
	addrs  addrList
	user   string
	tls    bool
	tlsCA  string
	prefix string
}

// addrHelp says which addresses --redis takes.
const addrHelp = `--redis takes host:port, a host alone (port 6379, as redis-cli),
redis://[[user]:password@]host[:port][/db], rediss://... (the same over
TLS), or unix:///path/to/socket[?db=N]. A URL's user and password are used
for that server; otherwise --user and $NETLOCK_PASSWORD are (a URL with one
word before @, redis://secret@host, gives a password, as redis-cli reads
it). A password in a URL on the command line shows in ps: prefer
$NETLOCK_PASSWORD.
`

// connHelp is the part of run's and status's help about reaching Redis.
const connHelp = `Redis: each --redis is one independent deployment (not a replica of
another, not another database of the same server); with several, the lock
is a quorum lock, held when a majority of them grant it. Without --redis,
the addresses come from $NETLOCK_REDIS (comma-separated), else
127.0.0.1:6379. $NETLOCK_REDIS may hold URLs with passwords: ps does not
show it.

` + addrHelp

// register defines the connection flags on fs: for run and status all of
// them; for the demo (one server, keys of its own) all but --prefix.
func (c *connFlags) register(fs *flag.FlagSet, demo bool) {
	if demo {
		fs.Var(&c.addrs, "redis", "use the Redis server at `address` (host[:port] or a URL, see above) instead of\nthe embedded one")
	} else {
		fs.Var(&c.addrs, "redis", "Redis server at `address` (host[:port] or a URL, see above); repeat for a\nquorum over independent servers (default $"+envRedis+", else "+defaultAddr+")")
		fs.StringVar(&c.prefix, "prefix", netlock.DefaultPrefix, "prefix of the lock's Redis keys, as netlock.WithPrefix")
	}
	fs.StringVar(&c.user, "user", "", "authenticate as the ACL `user` (password from $"+envPassword+")")
	fs.BoolVar(&c.tls, "tls", false, "connect with TLS, verifying the server against the system's roots\n(rediss:// URLs always do)")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "verify TLS servers against the CA certificates in PEM `file` (implies --tls)")
}

// A conn is how to reach the Redis deployments of a lock: validated
// connection flags and environment.
type conn struct {
	nodes  []node
	prefix string
}

// A node is how to reach one Redis deployment.
type node struct {
	name     string // for messages: as given, without its password
	network  string // "tcp" or "unix"
	address  string // host:port, or the socket's path
	user     string
	password string
	db       int
	tls      *tls.Config // nil without TLS
}

// resolve validates the flags of run and status, fills in the defaults from
// the environment (getenv), and reads the CA file. Its error is a usage
// error, worded for the user.
func (c *connFlags) resolve(getenv func(string) string) (*conn, error) {
	addrs, from := []string(c.addrs), "--redis"
	if len(addrs) == 0 {
		if env := getenv(envRedis); env != "" {
			from = "$" + envRedis
			for _, a := range strings.Split(env, ",") {
				addrs = append(addrs, strings.TrimSpace(a))
			}
		} else {
			addrs = []string{defaultAddr}
		}
	}
	if strings.ContainsAny(c.prefix, "{}") {
		// netlock.New's rule, in the flag's words.
		return nil, errors.New(badValue("--prefix", c.prefix, "want no '{' or '}', which netlock puts around the lock name"))
	}
	nodes, err := c.nodes(addrs, from, getenv)
	if err != nil {
		return nil, err
	}
	return &conn{nodes: nodes, prefix: c.prefix}, nil
}

// resolveDemo validates the demo's flags: one --redis at most. It returns
// nil without --redis: the demo then embeds its server.
func (c *connFlags) resolveDemo(getenv func(string) string) (*node, error) {
	switch {
	case len(c.addrs) > 1:
		return nil, errors.New("--redis given more than once; the demo uses one server")
	case len(c.addrs) == 0 && (c.user != "" || c.tls || c.tlsCA != ""):
		return nil, errors.New("--user, --tls and --tls-ca need --redis: the embedded server takes no password and no TLS")
	case len(c.addrs) == 0:
		return nil, nil
	}
	nodes, err := c.nodes(c.addrs, "--redis", getenv)
	if err != nil {
		return nil, err
	}
	return &nodes[0], nil
}

// nodes parses addrs, given by from, into nodes with their credentials and
// TLS.
func (c *connFlags) nodes(addrs []string, from string, getenv func(string) string) ([]node, error) {
	var tlsConfig *tls.Config
	if c.tlsCA != "" {
		pem, err := os.ReadFile(c.tlsCA)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err // without the path, which badValue shows
			}
			return nil, errors.New(badValue("--tls-ca", c.tlsCA, "cannot read it: "+err.Error()))
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, errors.New(badValue("--tls-ca", c.tlsCA, "want a file of PEM certificates; it holds none"))
		}
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	}
	password := getenv(envPassword)
	seen := map[string]string{}
	var nodes []node
	for _, a := range addrs {
		n, useTLS, err := parseNode(a)
		if err != nil {
			return nil, errors.New(badValue(from, redact(a), err.Error()))
		}
		// Two databases of one server are one deployment: two votes from
		// it would make the quorum a lie.
		server := n.network + " " + strings.ToLower(n.address)
		if first, ok := seen[server]; ok {
			if first == n.name {
				return nil, errors.New(badValue(from, n.name, "given twice; a quorum needs independent servers"))
			}
			return nil, errors.New(badValue(from, n.name, "the same server as "+first+"; a quorum needs independent servers"))
		}
		seen[server] = n.name
		if n.password == "" {
			// No password in the URL: $NETLOCK_PASSWORD, for the URL's user
			// or else --user's.
			if n.user == "" {
				n.user = c.user
			}
			n.password = password
		}
		if n.user != "" && n.password == "" {
			if c.user == n.user {
				return nil, fmt.Errorf("--user %s needs the password in $%s", n.user, envPassword)
			}
			return nil, errors.New(badValue(from, n.name, "names the user "+n.user+" without a password: give it in the URL or in $"+envPassword))
		}
		if n.network == "tcp" && (useTLS || c.tls || c.tlsCA != "") {
			n.tls = tlsConfig
			if n.tls == nil {
				n.tls = &tls.Config{MinVersion: tls.VersionTLS12}
			}
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// parseNode parses one address: host[:port], redis://, rediss:// (TLS, also
// reported as useTLS) or unix://. The error says what is wrong, for
// badValue: it does not repeat the address (nor so its password).
func parseNode(s string) (n node, useTLS bool, err error) {
	if !strings.Contains(s, "://") {
		return parseHostPort(s)
	}
	u, err := url.Parse(s)
	if err != nil {
		// url's error repeats the URL, password and all.
		return node{}, false, errors.New("not a valid URL")
	}
	if u.Opaque != "" || u.Fragment != "" {
		return node{}, false, errors.New("want redis://host:port/db, rediss://host:port/db or unix:///path/to/socket")
	}
	n.user, n.password = urlCredentials(u.User)
	dbText, err := urlDB(u.Query())
	if err != nil {
		return node{}, false, err
	}
	switch u.Scheme {
	case "redis", "rediss":
		n.network, useTLS = "tcp", u.Scheme == "rediss"
		n.address, dbText, err = redisURLAddress(u, dbText)
	case "unix":
		n.network = "unix"
		n.address, err = unixURLPath(u)
	default:
		err = fmt.Errorf("unknown scheme %q: want redis://, rediss:// or unix://", u.Scheme)
	}
	if err != nil {
		return node{}, false, err
	}
	if n.db, err = parseDB(dbText); err != nil {
		return node{}, false, err
	}
	n.name = n.display(u.Scheme)
	return n, useTLS, nil
}

// parseHostPort parses an address that is not a URL: host:port, with a
// port from 1 to 65535, or a host alone ("localhost", "10.0.0.1", "::1" or
// "[::1]"), on port 6379 as redis-cli takes it. Its node has no credentials
// and no TLS.
func parseHostPort(s string) (node, bool, error) {
	bad := errors.New("want host or host:port, such as localhost or 127.0.0.1:6379, or a redis://, rediss:// or unix:// URL")
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		// Not host:port: a host alone, an IPv6 address in brackets or not.
		host = s
		if inner, ok := strings.CutPrefix(s, "["); ok {
			if host, ok = strings.CutSuffix(inner, "]"); !ok || net.ParseIP(host) == nil {
				return node{}, false, bad
			}
		}
		if host == "" || strings.ContainsAny(host, "[]/ \t") || (strings.Contains(host, ":") && net.ParseIP(host) == nil) {
			return node{}, false, bad
		}
		address := net.JoinHostPort(host, defaultPort)
		return node{name: address, network: "tcp", address: address}, false, nil
	}
	if p, perr := strconv.Atoi(port); host == "" || perr != nil || p < 1 || p > 65535 {
		return node{}, false, bad
	}
	return node{name: s, network: "tcp", address: s}, false, nil
}

// urlCredentials returns the user and password of a URL's userinfo, as
// redis-cli reads them: one word before @ is a password. Both are "" for
// none.
func urlCredentials(u *url.Userinfo) (user, password string) {
	if u == nil {
		return "", ""
	}
	if p, ok := u.Password(); ok {
		return u.Username(), p
	}
	return "", u.Username() // redis://secret@host, as redis-cli reads it
}

// urlDB returns the database a URL's query q gives (db=N), "" for none. Its
// error names a parameter other than db, the first in sorted order.
func urlDB(q url.Values) (string, error) {
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if k != "db" {
			return "", fmt.Errorf("unknown parameter %q (only db)", k)
		}
	}
	return q.Get("db"), nil
}

// redisURLAddress returns the host:port of a redis:// or rediss:// URL u
// (localhost and port 6379 by default), and its database: the path's, or
// else dbText, the query's. Its error says that the database is given
// twice, or that the port is not one.
func redisURLAddress(u *url.URL, dbText string) (address, db string, err error) {
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		if dbText != "" {
			return "", "", fmt.Errorf("the database is given twice, as /%s and db=%s", p, dbText)
		}
		dbText = p
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "localhost" // as redigo.DialURL and redis-cli
	}
	if port == "" {
		port = defaultPort
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", "", fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return net.JoinHostPort(host, port), dbText, nil
}

// unixURLPath returns the socket's path of a unix:// URL u. Its error says
// that u has a host, or no path.
func unixURLPath(u *url.URL) (string, error) {
	if u.Host != "" || u.Path == "" {
		return "", errors.New("want unix:///path/to/socket, with three slashes")
	}
	return u.Path, nil
}

// parseDB returns the database numbered dbText, 0 for "". Its error says
// that dbText is not a number from 0 up.
func parseDB(dbText string) (int, error) {
	if dbText == "" {
		return 0, nil
	}
	db, err := strconv.Atoi(dbText)
	if err != nil || db < 0 {
		return 0, fmt.Errorf("database %q is not a number from 0 up", dbText)
	}
	return db, nil
}

// display names n as a URL of scheme without its password.
func (n *node) display(scheme string) string {
	user := ""
	if n.user != "" {
		user = url.User(n.user).String() + "@"
	}
	if n.network == "unix" {
		s := "unix://" + user + n.address
		if n.db != 0 {
			s += "?db=" + strconv.Itoa(n.db)
		}
		return s
	}
	s := scheme + "://" + user + n.address
	if n.db != 0 {
		s += "/" + strconv.Itoa(n.db)
	}
	return s
}

// redact returns the URL s with its password, if any, replaced by xxxxx:
// for messages about an address that could not be parsed.
func redact(s string) string {
	i := strings.Index(s, "://")
	if i < 0 {
		return s // not a URL: no password to tell apart
	}
	rest := s[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return s
	}
	userinfo := rest[:at]
	if user, _, ok := strings.Cut(userinfo, ":"); ok {
		userinfo = user + ":xxxxx"
	} else {
		userinfo = "xxxxx" // one word before @ is a password
	}
	return s[:i+3] + userinfo + rest[at:]
}

// dialOptions are redigo's options for n: credentials, database and TLS.
// TLS goes through a tls.Dialer, not redigo's DialUseTLS: its handshake
// honours the context, so a server that stalls in the handshake costs no
// more than the node timeout. It takes the server name from the address.
func (n *node) dialOptions() []redis.DialOption {
	var opts []redis.DialOption
	if n.password != "" {
		opts = append(opts, redis.DialUsername(n.user), redis.DialPassword(n.password))
	}
	if n.db != 0 {
		opts = append(opts, redis.DialDatabase(n.db))
	}
	if cfg := n.tls; cfg != nil {
		opts = append(opts, redis.DialContextFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := tls.Dialer{Config: cfg}
			return d.DialContext(ctx, network, addr)
		}))
	}
	return opts
}

// dial connects to n with redigo, bounded by ctx.
func (n *node) dial(ctx context.Context, extra ...redis.DialOption) (redis.Conn, error) {
	return redis.DialContext(ctx, n.network, n.address, append(n.dialOptions(), extra...)...)
}

// pool returns a redigo pool for n. Dialling, AUTH and SELECT happen when a
// connection is first used, bounded by the context of that use. The caller
// closes the pool.
func (n *node) pool(maxIdle int, extra ...redis.DialOption) *redis.Pool {
	return &redis.Pool{
		MaxIdle: maxIdle,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return n.dial(ctx, extra...)
		},
	}
}

// rueidisOption is rueidis's client option for n.
func (n *node) rueidisOption() rueidis.ClientOption {
	o := rueidis.ClientOption{
		InitAddress:  []string{n.address},
		Username:     n.user,
		Password:     n.password,
		SelectDB:     n.db,
		TLSConfig:    n.tls,
		DisableCache: true, // netlock never reads through the cache; miniredis has no CLIENT TRACKING
	}
	if n.network == "unix" {
		o.DialCtxFn = func(ctx context.Context, _ string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return d.DialContext(ctx, "unix", n.address)
		}
	}
	return o
}

// goredisOptions are go-redis's client options for n, with up to poolSize
// connections. ContextTimeoutEnabled lets netlock's node timeout bound each
// command (see package netlock/goredis); one dial and no retries of a
// command report a server that refuses connections at once, as the other
// clients do (netlock retries by itself).
func (n *node) goredisOptions(poolSize int) *redisv9.Options {
	return &redisv9.Options{
		Network:               n.network,
		Addr:                  n.address,
		Username:              n.user,
		Password:              n.password,
		DB:                    n.db,
		TLSConfig:             n.tls,
		PoolSize:              poolSize,
		ContextTimeoutEnabled: true,
		DialerRetries:         1,
		MaxRetries:            -1,
	}
}

// pools returns one redigo pool per node; the caller closes them.
func (c *conn) pools() []*redis.Pool {
	pools := make([]*redis.Pool, len(c.nodes))
	for i := range c.nodes {
		pools[i] = c.nodes[i].pool(2) // the watchdog's extend and the release
	}
	return pools
}

// backends returns one netlock Backend per pool.
func backends(pools []*redis.Pool) []netlock.Backend {
	b := make([]netlock.Backend, len(pools))
	for i, p := range pools {
		b[i] = netlock.NewRedigo(p)
	}
	return b
}

// where names the nodes for a message: "127.0.0.1:6379", or "node 0
// 10.0.0.1:6379, node 1 10.0.0.2:6379" for a quorum, whose errors name nodes
// by index.
func (c *conn) where() string {
	if len(c.nodes) == 1 {
		return c.nodes[0].name
	}
	s := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		s[i] = fmt.Sprintf("node %d %s", i, n.name)
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
