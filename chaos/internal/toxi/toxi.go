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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
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
//
// Its toxics come off last first (Remove reports a test error otherwise;
// Cut takes off any), and its stall (Stall, Resume) is a toxic that stays
// on from its start, switched on and off, since a stall and the faults
// around it come and go in any order.
//
// That is what keeps toxiproxy's links in step with their proxy's toxic
// collection, which its AddToxic needs. A link (one direction of one
// connection) has a chain of stubs, one per toxic, which the collection
// addresses by the toxic's index in its own chain. A removal leaves the
// toxic's stub, closed, in the chain of a link whose connection is ending
// (link.go:216, 242-248, 260-264) or when the toxic's cleanup closes it (a
// blackhole, link.go:217-225), and the link stays in the collection until
// its stubs have drained (link.go:165; a latency stub holding bytes keeps
// it up to its latency). If a toxic added after the removed one is still
// on, the collection's removal of that one takes the closed stub for its
// own and leaves the live one: the link's chain is then two stubs longer
// than the collection's, and the next AddToxic runs the link's last stub
// with a toxic past the end of the collection's chain (link.go:186: index
// out of range, the test process panics). Removed last first, a toxic is
// the last of the collection's chain, and what its removal leaves in a
// link is closed and at the end of the link's chain, where AddToxic finds
// the last stub closed and goes no further (link.go:187-191).
type Proxy struct {
	x              *Toxiproxy
	name, upstream string
	addr           string
	stall          *stall

	// mu guards what follows, and serialises Add, Remove, Cut and Close.
	mu     sync.Mutex
	p      *toxiproxy.Proxy // replaced by Cut
	toxics map[string]Toxic // added and not removed, by name
	order  []string         // the names in toxics, in the order of their adding
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
	st := newStall()
	p := toxiproxy.NewProxy(x.api, name, "127.0.0.1:0", upstream)
	if err := addStall(p, st); err != nil {
		x.t.Fatalf("toxi: toxiproxy %s to %s: %v", name, upstream, err)
		return nil
	}
	if err := p.Start(); err != nil {
		x.t.Fatalf("toxi: toxiproxy %s to %s: %v", name, upstream, err)
		return nil
	}
	tp := &Proxy{x: x, name: name, upstream: upstream, addr: p.Listen, stall: st, p: p, toxics: map[string]Toxic{}}
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
	p.order = append(p.order, name)
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

// Remove removes the toxic called name, which must be the last one added
// of those on p (see Proxy): it reports a test error and leaves the toxic
// on otherwise. Removing a toxic that is not there does nothing. Bytes a
// latency toxic held are delivered at once.
func (p *Proxy) Remove(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.toxics[name]; !ok {
		return
	}
	if last := p.order[len(p.order)-1]; last != name {
		p.x.t.Errorf("toxi: toxiproxy %s: removing toxic %q while %q, added after it, is on: toxics come off last first", p.addr, name, last)
		return
	}
	delete(p.toxics, name)
	p.order = p.order[:len(p.order)-1]
	p.p.Toxics.RemoveToxic(context.Background(), name)
}

// Stall holds back every byte p's clients send, on their connections
// and on new ones, until Resume: the network of a client whose process is
// paused. What the server sends still arrives.
func (p *Proxy) Stall() { p.stall.set(true) }

// Resume ends a Stall: what it held back is delivered at once, in order.
func (p *Proxy) Resume() { p.stall.set(false) }

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
// good, and a toxic that closes its stub on removal (a blackhole) leaves
// its stub in that connection's chain (see Proxy). A new proxy has a
// collection of its own, with no such connection; it takes the stall and
// the toxics kept, in the order of their adding.
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
	p.order = slices.DeleteFunc(p.order, func(name string) bool { _, ok := p.toxics[name]; return !ok })
	next := toxiproxy.NewProxy(p.x.api, p.name, p.addr, p.upstream)
	if err := addStall(next, p.stall); err != nil {
		return fmt.Errorf("toxi: toxiproxy %s: after a cut: %w", p.addr, err)
	}
	for _, name := range p.order {
		if err := add(next, name, p.toxics[name]); err != nil {
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
	p.stall.close()
	p.p.Toxics.ResetToxics(context.Background())
}

// A stall is the state of a Proxy's stall, which its stall toxics (one per
// toxiproxy proxy it has had) read.
type stall struct {
	id      uint64
	mu      sync.Mutex
	on      bool
	changed chan struct{} // closed, and replaced, when on changes
}

// stalls holds the stall of every open Proxy, by id, for the stall
// toxics: toxiproxy makes a toxic from its JSON attributes.
var (
	stalls  sync.Map // uint64 → *stall
	stallID atomic.Uint64
)

func newStall() *stall {
	s := &stall{id: stallID.Add(1), changed: make(chan struct{})}
	stalls.Store(s.id, s)
	return s
}

// state returns whether the stall is on, and a channel closed when that
// changes.
func (s *stall) state() (on bool, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.on, s.changed
}

func (s *stall) set(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.on != on {
		s.on = on
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// close ends the stall for good, and lets its toxics find it no more.
func (s *stall) close() {
	s.set(false)
	stalls.Delete(s.id)
}

// stallType is the toxiproxy type of the stall toxic.
const stallType = "netlock_toxi_stall"

func init() { toxics.Register(stallType, new(stallToxic)) }

// addStall adds the stall toxic of s to p, the first of its toxics.
func addStall(p *toxiproxy.Proxy, s *stall) error {
	return add(p, stallType, Toxic{stallType, "upstream", map[string]any{"id": s.id}})
}

// A stallToxic passes every chunk on as it comes, except while its stall
// is on, when it holds the chunks back; it drops none. Interrupted while
// it holds a chunk (toxiproxy interrupts a toxic to change the chain
// around it), it keeps the chunk in its stub's state for its next run,
// which toxiproxy starts once the chain is changed.
type stallToxic struct {
	ID uint64 `json:"id"`
}

// heldChunk is a stall toxic's state on a stub: the chunk it held when
// interrupted.
type heldChunk struct{ c *stream.StreamChunk }

func (t *stallToxic) NewState() any { return new(heldChunk) }

// GetBufferSize is a latency toxic's, so that a stalled link takes as
// much before it pushes back.
func (t *stallToxic) GetBufferSize() int { return 1024 }

func (t *stallToxic) Pipe(stub *toxics.ToxicStub) {
	held, _ := stub.State.(*heldChunk)
	var s *stall
	if v, ok := stalls.Load(t.ID); ok {
		s = v.(*stall)
	}
	for {
		var c *stream.StreamChunk
		if held != nil && held.c != nil {
			c, held.c = held.c, nil
		} else {
			select {
			case <-stub.Interrupt:
				return
			case c = <-stub.Input:
				if c == nil {
					stub.Close()
					return
				}
			}
		}
		for s != nil {
			on, changed := s.state()
			if !on {
				break
			}
			select {
			case <-changed:
			case <-stub.Interrupt:
				if held != nil {
					held.c = c
				} else {
					stub.Output <- c // no state to keep it in: not dropped
				}
				return
			}
		}
		stub.Output <- c
	}
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
