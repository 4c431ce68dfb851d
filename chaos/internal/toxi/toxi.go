// Package toxi runs Shopify's toxiproxy in the test process, as a library,
// for netlock's chaos tests: the network between a client and a
// redis-server, with faults (latency, blackholes, resets, connections cut
// mid-reply) added and removed while the clients run. It lives in the chaos
// module so that toxiproxy, and what it brings (prometheus, gorilla/mux,
// zerolog, protobuf), stay out of the library's go.mod.
package toxi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// A Toxiproxy is a toxiproxy server with no HTTP API and no
// toxiproxy-server binary. Each Proxy it makes forwards one listening
// address to one upstream, and toxics added to it act on every connection
// through it, present and future.
//
// Its methods, and those of its proxies, are safe for concurrent use: a
// client goroutine may cut its own network.
type Toxiproxy struct {
	t   testing.TB
	api *toxiproxy.ApiServer

	mu      sync.Mutex
	proxies []*Proxy
	n       int
}

// New returns a Toxiproxy whose proxies are all stopped by t.Cleanup.
func New(t testing.TB) *Toxiproxy {
	t.Helper()
	x := &Toxiproxy{
		t:   t,
		api: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
	}
	t.Cleanup(x.closeAll)
	return x
}

// A Proxy is one proxy of a Toxiproxy.
type Proxy struct {
	x              *Toxiproxy
	name, upstream string
	addr           string

	// mu guards what follows, and serialises Add, Remove, Cut and Close.
	mu     sync.Mutex
	p      *toxiproxy.Proxy // replaced by Cut
	toxics map[string]Toxic // added and not removed, by name
	closed bool
}

// Proxy starts a proxy from a free 127.0.0.1 port to upstream. It calls
// t.Fatalf if the proxy cannot listen, so it must be called from the
// goroutine running the test.
func (x *Toxiproxy) Proxy(upstream string) *Proxy {
	x.t.Helper()
	x.mu.Lock()
	x.n++
	name := fmt.Sprintf("proxy%d", x.n)
	x.mu.Unlock()
	p := toxiproxy.NewProxy(x.api, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		x.t.Fatalf("toxi: toxiproxy %s to %s: %v", name, upstream, err)
		return nil
	}
	tp := &Proxy{x: x, name: name, upstream: upstream, addr: p.Listen, p: p, toxics: map[string]Toxic{}}
	x.mu.Lock()
	x.proxies = append(x.proxies, tp)
	x.mu.Unlock()
	return tp
}

func (x *Toxiproxy) closeAll() {
	x.mu.Lock()
	ps := x.proxies
	x.proxies = nil
	x.mu.Unlock()
	for _, p := range ps {
		p.Close()
	}
}

// Addr returns the address clients connect to, "127.0.0.1:PORT". It stays
// the same across Cut.
func (p *Proxy) Addr() string { return p.addr }

// A Toxic is one toxiproxy toxic: its type ("latency", "timeout",
// "reset_peer", "limit_data", "bandwidth", "slicer", "slow_close"), the
// stream it acts on ("upstream": client to server, or "downstream") and its
// attributes, as in toxiproxy's documentation.
type Toxic struct {
	Type       string
	Stream     string
	Attributes map[string]any
}

// Latency delays every chunk by ms milliseconds plus or minus up to jitter.
// Bytes are delayed, never dropped: the stream stays intact.
func Latency(stream string, ms, jitter int) Toxic {
	return Toxic{"latency", stream, map[string]any{"latency": ms, "jitter": jitter}}
}

// Blackhole drops every byte and never closes the connection: a network that
// went silent. Dropping bytes tears the request/reply stream, so a
// blackhole should end with Cut(name), which closes the connections (the way
// a TCP stack eventually gives up) before it removes the toxic.
func Blackhole(stream string) Toxic {
	return Toxic{"timeout", stream, map[string]any{"timeout": 0}}
}

// ResetPeer closes each connection ms milliseconds after its next data.
func ResetPeer(stream string, ms int) Toxic {
	return Toxic{"reset_peer", stream, map[string]any{"timeout": ms}}
}

// LimitData closes each connection once n bytes have passed: in the middle
// of a reply, with the downstream stream and a small n.
func LimitData(stream string, n int) Toxic {
	return Toxic{"limit_data", stream, map[string]any{"bytes": n}}
}

// Add adds toxic under name, which must not be in use on p.
func (p *Proxy) Add(name string, toxic Toxic) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := add(p.p, name, toxic); err != nil {
		return fmt.Errorf("toxi: toxiproxy %s: %w", p.addr, err)
	}
	p.toxics[name] = toxic
	return nil
}

func add(p *toxiproxy.Proxy, name string, toxic Toxic) error {
	body, err := json.Marshal(map[string]any{
		"name":       name,
		"type":       toxic.Type,
		"stream":     toxic.Stream,
		"toxicity":   1.0,
		"attributes": toxic.Attributes,
	})
	if err != nil {
		return err
	}
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		return fmt.Errorf("add %s toxic %q: %w", toxic.Type, name, err)
	}
	return nil
}

// Remove removes the toxic called name; removing a toxic that is not there
// does nothing. Bytes a latency toxic held are delivered at once.
func (p *Proxy) Remove(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.toxics[name]; !ok {
		return
	}
	delete(p.toxics, name)
	p.p.Toxics.RemoveToxic(context.Background(), name)
}

// relistenAttempts bounds how many times Cut tries to listen again on the
// proxy's address.
const relistenAttempts = 5

// Cut closes every connection through p, as a reset would, drops the
// toxics named in remove, and listens again on the same address for new
// connections, with the other toxics. Remove a Blackhole this way: removed
// while a connection is open, it would let later requests through after
// dropping earlier ones, and a client would match replies to the wrong
// requests.
//
// The proxy listening after a cut is a new toxiproxy proxy, not the old one
// started again: a connection of the old one whose goroutines toxiproxy
// left blocked (see Leaks) stays in the old proxy's toxic collection for
// good, and when a toxic that closes its stub on removal (a blackhole) is
// removed, toxiproxy leaves that connection's chain of toxics longer than
// the collection's; adding a toxic to the collection afterwards then
// panics with an index out of range (toxiproxy v2.5.0 to v2.12.0, link.go,
// ToxicLink.AddToxic and RemoveToxic). A new proxy has a collection of its
// own, with no such connection.
func (p *Proxy) Cut(remove ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.p.Stop()
	for _, name := range remove {
		delete(p.toxics, name)
	}
	next := toxiproxy.NewProxy(p.x.api, p.name, p.addr, p.upstream)
	for name, toxic := range p.toxics {
		if err := add(next, name, toxic); err != nil {
			return fmt.Errorf("toxi: toxiproxy %s: after a cut: %w", p.addr, err)
		}
	}
	var err error
	for range relistenAttempts {
		if err = next.Start(); err == nil {
			p.p = next
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("toxi: toxiproxy %s: listen again after a cut: %w", p.addr, err)
}

// Close stops p and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.p.Stop()
	p.p.Toxics.ResetToxics(context.Background())
}

// Leaks names functions of toxiproxy that can stay on the stack of
// goroutines it leaves blocked for good, for goleak.IgnoreAnyFunction. When
// a connection's destination fails (a server killed) while bytes are on
// their way through a link, the goroutine that writes to the destination
// returns, and the toxics before it, and the reader feeding them, block
// forever on channel sends no one will receive; or the writer waits forever
// for toxics that are stuck. They are toxiproxy's link goroutines, never
// netlock's.
var Leaks = []string{
	"github.com/Shopify/toxiproxy/v2.(*ToxicLink).read",
	"github.com/Shopify/toxiproxy/v2.(*ToxicLink).write",
	"github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run",
}
