package redistest

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

// Toxiproxy runs Shopify's toxiproxy in the test process, as a library: no
// toxiproxy-server binary and no HTTP API. Each ToxiProxy it makes forwards
// one listening address to one upstream, and toxics added to it (latency,
// blackholes, resets, cut-offs after some bytes) act on every connection
// through it, present and future.
//
// Its methods are safe for concurrent use, unlike the Server methods that
// control a process: a client goroutine may cut its own network.
type Toxiproxy struct {
	t   testing.TB
	api *toxiproxy.ApiServer

	mu      sync.Mutex
	proxies []*ToxiProxy
	n       int
}

// NewToxiproxy returns a Toxiproxy whose proxies are all stopped by
// t.Cleanup.
func NewToxiproxy(t testing.TB) *Toxiproxy {
	t.Helper()
	x := &Toxiproxy{
		t:   t,
		api: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
	}
	t.Cleanup(x.closeAll)
	return x
}

// ToxiProxy is one proxy of a Toxiproxy.
type ToxiProxy struct {
	p    *toxiproxy.Proxy
	addr string

	mu     sync.Mutex // serialises Cut with itself and Close
	closed bool
}

// Proxy starts a proxy from a free 127.0.0.1 port to upstream.
func (x *Toxiproxy) Proxy(upstream string) *ToxiProxy {
	x.t.Helper()
	x.mu.Lock()
	x.n++
	name := fmt.Sprintf("proxy%d", x.n)
	x.mu.Unlock()
	p := toxiproxy.NewProxy(x.api, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		x.t.Fatalf("redistest: toxiproxy %s to %s: %v", name, upstream, err)
		return nil
	}
	tp := &ToxiProxy{p: p, addr: p.Listen}
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
func (p *ToxiProxy) Addr() string { return p.addr }

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
func (p *ToxiProxy) Add(name string, toxic Toxic) error {
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
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		return fmt.Errorf("redistest: toxiproxy %s: add %s toxic %q: %w", p.addr, toxic.Type, name, err)
	}
	return nil
}

// Remove removes the toxic called name; removing a toxic that is not there
// does nothing. Bytes a latency toxic held are delivered at once.
func (p *ToxiProxy) Remove(name string) {
	p.p.Toxics.RemoveToxic(context.Background(), name)
}

// Cut closes every connection through p, as a reset would, removes the
// toxics named in remove while none is open, and listens again on the same
// address for new connections. Remove a Blackhole this way: removed while a
// connection is open, it would let later requests through after dropping
// earlier ones, and a client would match replies to the wrong requests.
func (p *ToxiProxy) Cut(remove ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.p.Stop()
	for _, name := range remove {
		p.p.Toxics.RemoveToxic(context.Background(), name)
	}
	var err error
	for attempt := 0; attempt < startAttempts; attempt++ {
		if err = p.p.Start(); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("redistest: toxiproxy %s: listen again after a cut: %w", p.addr, err)
}

// Close stops p and closes every connection through it.
func (p *ToxiProxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.p.Stop()
	p.p.Toxics.ResetToxics(context.Background())
}

// ToxiproxyLeaks names functions of toxiproxy (v2.5.0) that can stay on
// the stack of goroutines it leaves blocked for good, for
// goleak.IgnoreAnyFunction. When a connection's destination fails (a server
// killed) while bytes are on their way through a link, the goroutine that
// writes to the destination returns, and the toxics before it, and the
// reader feeding them, block forever on channel sends no one will receive;
// or the writer waits forever for toxics that are stuck. They are
// toxiproxy's link goroutines, never netlock's.
var ToxiproxyLeaks = []string{
	"github.com/Shopify/toxiproxy/v2.(*ToxicLink).read",
	"github.com/Shopify/toxiproxy/v2.(*ToxicLink).write",
	"github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run",
}
