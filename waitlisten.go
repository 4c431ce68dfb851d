package netlock

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// listen watches our release channel on every node that has a hub and is
// not watched yet (or whose watch died), in parallel when there are
// several, each bounded by the node timeout. It reports whether a new watch
// was set up: then an attempt must follow before sleeping, for a release
// published before the subscription reached nobody, and the attempt joins
// the queue. A node whose user may not publish or subscribe on our
// channels (see engine.checkChannels) fails it with that error: no
// release could tell us, nor could ours tell the waiters behind us.
func (w *waiter) listen(ctx context.Context) (bool, error) {
	m := w.m
	w.init()
	need := make([]bool, len(m.nodes)) // decided once: a watch may die meanwhile
	for i := range m.nodes {
		h := m.hubs[i]
		need[i] = h != nil && (w.failed[i] < maxWatchFailures || h.sharded()) && (w.watches[i] == nil || w.watches[i].dead())
	}
	if err := m.checkChannels(ctx, need); err != nil {
		return false, err
	}
	got := make([]*watch, len(m.nodes))
	errs := make([]error, len(m.nodes))
	wake := w.wake
	if len(m.nodes) == 1 {
		if need[0] {
			got[0], errs[0] = m.watch(ctx, 0, wake)
		}
	} else {
		var wg sync.WaitGroup
		for i := range m.nodes {
			if need[i] {
				wg.Go(func() { got[i], errs[i] = m.watch(ctx, i, wake) })
			}
		}
		wg.Wait()
	}
	fresh := false
	var refused error
	for i := range m.nodes {
		if !need[i] {
			continue
		}
		if old := w.watches[i]; old != nil {
			old.stop()
		}
		w.watches[i] = got[i]
		if got[i] == nil {
			w.failed[i]++
			if refused == nil && aclRefusal(errs[i]) {
				// An answer that retrying cannot change: as the
				// acquire's, it matches ErrQuorum.
				refused = &quorumError{nodes: len(m.nodes), need: m.quorum, errs: []error{nodeError(i, errs[i])}}
			}
		} else {
			w.failed[i] = 0 // only failures in a row make a node's waiters poll
			fresh = true
		}
	}
	return fresh, refused
}

// watch watches m's release channel on node i's hub, bounded by the node
// timeout; nil and the error if it could not.
func (m *engine) watch(ctx context.Context, i int, wake chan<- string) (*watch, error) {
	wt, err := m.watchChannelFor(ctx, i, m.waitChan, wake, m.orphan)
	// A MultiMutex waits in the queue of whichever of its names is held:
	// it watches the release channel of each, all or none.
	for _, c := range m.alsoChans {
		if wt == nil {
			return nil, err
		}
		a, err := m.watchChannel(ctx, i, c, wake)
		if a == nil {
			wt.stop()
			return nil, err
		}
		wt.also = append(wt.also, a)
	}
	return wt, err
}

// watchChannel watches channel on node i's hub, bounded by the node
// timeout; nil and the error if it could not.
func (m *engine) watchChannel(ctx context.Context, i int, channel string, wake chan<- string) (*watch, error) {
	return m.watchChannelFor(ctx, i, channel, wake, nil)
}

// watchChannelFor is watchChannel with the Hub's orphan handler of channel
// (see Hub.watchFor).
func (m *engine) watchChannelFor(ctx context.Context, i int, channel string, wake chan<- string, orphan func(string)) (*watch, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.nodeTimeout)
	defer cancel()
	return m.hubs[i].watchFor(ctx, channel, wake, orphan)
}

// orphan takes a message on m's release channel that reached no waiter:
// every waiter of m that listened has stopped (see Hub.watchFor). A grant
// in it to a waiter of m that gave up (see gaveUp) went to a place that
// outlived it: a release popped it after the waiter stopped listening, or
// the network held its join back past its leave. Its leave, if it comes
// after, finds the lock granted and passes it on; but nothing else would
// until the grant expires. It is released at once, as granted releases a
// grant to an earlier call. A grant to a waiter that succeeded is m's hold
// (adopted by an attempt, the message late), or was: never released here.
func (m *engine) orphan(payload string) {
	nonce, n, _, ok := parseGrant(payload)
	if !ok {
		return
	}
	go func() { // not on the Hub's reading goroutine, which holds its lock
		if m.gaveUpOn(nonce) {
			m.release(context.Background(), m.grantValue(nonce, n), "", nil, true)
		}
	}()
}

// gaveUpOn reports whether a waiter of m gave up the place it joined
// under nonce lately.
func (m *engine) gaveUpOn(nonce string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.gaveUp[:], nonce)
}

// gaveUpLocked records that the waiter of nonce gave up (see orphan). The
// caller holds m.mu.
func (m *engine) gaveUpLocked(nonce string) {
	m.gaveUp[m.gaveUpNext] = nonce
	m.gaveUpNext = (m.gaveUpNext + 1) % len(m.gaveUp)
}

// parseGrant reads a release's grant message, "g:<nonce>:<n>:<token>" (see
// lua/handon.lua): the lock's value is "<nonce>.<n>".
func parseGrant(payload string) (nonce, n string, token uint64, ok bool) {
	rest, ok := strings.CutPrefix(payload, "g:")
	if !ok {
		return "", "", 0, false
	}
	nonce, rest, _ = strings.Cut(rest, ":")
	n, tok, _ := strings.Cut(rest, ":")
	token, err := strconv.ParseUint(tok, 10, 64)
	if err != nil {
		return "", "", 0, false
	}
	return nonce, n, token, true
}

// join watches our release channel on every node where it is subscribed
// already, without I/O (see hub.join). The uncontended path allocates
// nothing here.
func (w *waiter) join() {
	m := w.m
	for i, h := range m.hubs {
		if h == nil || !h.subscribed(m.waitChan) {
			continue
		}
		w.init()
		w.watches[i] = m.joinAll(h, w.wake)
	}
}

// joinAll joins, on hub h, our release channel and those of alsoChans (a
// MultiMutex's other names), all or none; nil if one is not subscribed and
// confirmed already.
func (m *engine) joinAll(h *Hub, wake chan<- string) *watch {
	wt := h.join(m.waitChan, wake)
	for _, c := range m.alsoChans {
		if wt == nil {
			return nil
		}
		a := h.join(c, wake)
		if a == nil {
			wt.stop()
			return nil
		}
		wt.also = append(wt.also, a)
	}
	return wt
}

func (w *waiter) init() {
	if w.watches == nil {
		n := len(w.m.nodes)
		if w.wake == nil {
			w.wake = make(chan string, 1)
		}
		w.watches = make([]*watch, n)
		w.failed = make([]int, n)
	}
}

// listening reports whether our release channel is watched on some node.
func (w *waiter) listening() bool {
	for _, wt := range w.watches {
		if wt != nil && !wt.dead() {
			return true
		}
	}
	return false
}

// deadWatch reports whether a watch died with its connection.
func (w *waiter) deadWatch() bool {
	for _, wt := range w.watches {
		if wt != nil && wt.dead() {
			return true
		}
	}
	return false
}
