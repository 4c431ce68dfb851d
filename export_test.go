package netlock

import (
	"slices"
	"sync"
)

// Client libraries for the tests of this package besides the built-in
// redigo and rueidis. A Backend package built on netlock (netlock/goredis)
// cannot be imported by these tests, which are package netlock: it imports
// netlock. So it registers itself from an external test file of this
// directory (package netlock_test, compiled into the same test binary),
// whose init runs before any test, as net/http's tests do with
// export_test.go.

// TestClientConfig is what a test client connects to.
type TestClientConfig struct {
	Addr               string // "host:port" of one server
	Username, Password string // empty: no AUTH
	// Cluster, if set, lists nodes of a Redis Cluster: the client is a
	// cluster client of it, and Addr is unused.
	Cluster []string
}

// RegisterTestClient adds the client library name to the ones that the
// tests and benchmarks of package netlock run on wherever they run on each
// (forEachEnv, newBackend, and the tables over clients). open returns a
// Backend on a client of its own for c, as another process would have, and
// the function that closes the client. It must be called from an init
// function.
func RegisterTestClient(name string, open func(c TestClientConfig) (b Backend, close func(), err error)) {
	testClientsMu.Lock()
	defer testClientsMu.Unlock()
	if slices.Contains(builtinClients, name) || registeredClients[name] != nil {
		panic("netlock: test client " + name + " registered twice")
	}
	registeredClients[name] = open
	registeredOrder = append(registeredOrder, name)
}

// builtinClients are the client libraries of netlock's own Backends.
var builtinClients = []string{"redigo", "rueidis"}

var (
	testClientsMu     sync.Mutex
	registeredClients = map[string]func(TestClientConfig) (Backend, func(), error){}
	registeredOrder   []string
)

// testClients returns the names of the client libraries the tests run on:
// the built-in ones, then the registered ones in the order registered.
func testClients() []string {
	testClientsMu.Lock()
	defer testClientsMu.Unlock()
	return append(slices.Clone(builtinClients), registeredOrder...)
}

// registeredClient returns the opener of a registered client library, or
// nil.
func registeredClient(name string) func(TestClientConfig) (Backend, func(), error) {
	testClientsMu.Lock()
	defer testClientsMu.Unlock()
	return registeredClients[name]
}
