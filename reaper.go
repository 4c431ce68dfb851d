package netlock

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"
)

// A reaper delivers releases that could not be delivered when they were
// sent: to a node that was stalled, partitioned or reconnecting when an
// acquire round failed or a hold was unlocked. Such a node may still run our
// acquire when it comes back; one release that reaches it afterwards (or a
// tombstone it leaves, if it arrives first) keeps the key from being
// stranded until its TTL runs out.
//
// Its goroutine runs only while releases are pending and ends when every
// one has been answered, its client was closed, or it is older than the
// tombstone TTL (after that, a delivery would no longer stop a late
// acquire).
type reaper struct {
	mu      sync.Mutex
	pending []pendingRelease
	running bool
}

type pendingRelease struct {
	node   int
	value  string
	giveUp time.Time
}

// reapLater queues releases of value for the nodes whose replies were
// errors, and starts the reaper's goroutine if it is not running.
func (m *NetMutex) reapLater(value string, replies []nodeReply, targets []bool) {
	r := &m.reaper
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, rep := range replies {
		if (targets == nil || targets[i]) && rep.err != nil && !finalErr(m.nodes[i], rep.err) {
			r.pending = append(r.pending, pendingRelease{node: i, value: value, giveUp: time.Now().Add(10 * m.cfg.expiry)})
		}
	}
	if len(r.pending) > 0 && !r.running {
		r.running = true
		go m.reap()
	}
}

// reap retries the pending releases, with a growing pause between passes,
// until none is left.
func (m *NetMutex) reap() {
	r := &m.reaper
	pause := 10 * time.Millisecond
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		<-t.C
		r.mu.Lock()
		batch := r.pending
		r.pending = nil
		r.mu.Unlock()

		var left []pendingRelease
		for _, p := range batch {
			if time.Now().After(p.giveUp) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), m.cfg.nodeTimeout)
			rep := m.call(ctx, p.node, releaseScript,
				m.releaseKeys(p.value), []string{p.value, m.keys.channel, m.tombMS})
			cancel()
			if rep.err != nil && !finalErr(m.nodes[p.node], rep.err) {
				left = append(left, p)
			}
		}

		r.mu.Lock()
		r.pending = append(left, r.pending...)
		if len(r.pending) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		pause = min(2*pause, 250*time.Millisecond)
		t.Reset(pause)
	}
}

// A finalErrer is a Backend that can tell a final error: an error reply
// from the server (it ran or refused the request: nothing is in flight), or
// a closed client (nothing sent through it will be delivered). Retrying the
// release after a final error cannot change anything.
type finalErrer interface {
	finalErr(err error) bool
}

func finalErr(b Backend, err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		// Nothing listens: whatever we sent to the node before died with
		// its process (and a key it had persisted keeps its TTL).
		return true
	}
	f, ok := b.(finalErrer)
	return ok && f.finalErr(err)
}
