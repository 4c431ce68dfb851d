package netlock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// sharesWrite reports whether this process's readers read under its write
// lock while one of its writers holds or waits for it (see enterShared),
// rather than on a read lease of their own: when its read sections are
// short beside a round trip to Redis. Then sharing the write lock costs
// nothing and saves the round trips of a lease taken and given back around
// each writer; readers of other processes wait meanwhile, as for a
// NetMutex within its hand-off bound. Longer sections gain more from
// reading alongside other processes, on a lease. The caller holds rw.mu.
func (rw *NetRWMutex) sharesWrite() bool {
	rtt := rw.w.rtt.Load()
	if r := rw.r.rtt.Load(); r > 0 && (rtt == 0 || r < rtt) {
		rtt = r
	}
	return rtt == 0 || rw.sections.mean() < shareWriteRTTs*time.Duration(rtt)
}

// shareWriteRTTs: read sections shorter on average than this many round
// trips share the write lock (see sharesWrite).
const shareWriteRTTs = 2

// A leaseWatch listens on a NetRWMutex's channel p{name}:rw:joined, where
// lua/rw_acquire.lua tells of a writer taking its place, on every node with a Hub,
// while its process holds a read lease, to hear at once of a writer taking
// its place: from then on no more readers of the process share the lease.
// Where the channel is subscribed already (a lease of this process held a
// moment ago) it costs no I/O; otherwise it subscribes in the background, each node's subscription bounded by the node timeout. A
// writer missed (one that took its place as the lease was being taken,
// before the subscription was confirmed, or a burst of messages beyond the
// buffer) is learned from the lease's next extend.
type leaseWatch struct {
	wake    chan string
	mu      sync.Mutex
	watches []*watch
	stopped bool
}

// leaseWatchBuffer: messages the lease watch keeps between two looks.
const leaseWatchBuffer = 16

func (rw *NetRWMutex) newLeaseWatch() *leaseWatch {
	r := rw.r
	lw := &leaseWatch{wake: make(chan string, leaseWatchBuffer)}
	for i, h := range r.hubs {
		if h == nil {
			continue
		}
		if wt := h.join(rw.joined, lw.wake); wt != nil {
			lw.mu.Lock() // a node's subscription made in the background appends too
			lw.watches = append(lw.watches, wt)
			lw.mu.Unlock()
			continue
		}
		go func() {
			wt, _ := r.watchChannel(context.Background(), i, rw.joined, lw.wake)
			if wt == nil {
				return
			}
			lw.mu.Lock()
			defer lw.mu.Unlock()
			if lw.stopped {
				wt.stop()
				return
			}
			lw.watches = append(lw.watches, wt)
		}()
	}
	return lw
}

// heard reports whether a writer took its place since the last look, and
// whether one gave its place up (or a connection failed, which may have
// lost a message).
func (lw *leaseWatch) heard() (joined, left bool) {
	for {
		select {
		case p := <-lw.wake:
			joined = joined || p == rwJoined
			left = left || p != rwJoined
		default:
			return joined, left
		}
	}
}

func (lw *leaseWatch) stop() {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.stopped = true
	for _, wt := range lw.watches {
		wt.stop()
	}
}

// rlock is RLockCtx: on the lease, or under the write lock (see
// sharesWrite).
func (rw *NetRWMutex) rlock(ctx context.Context) error {
	for {
		rw.mu.Lock()
		var in bool
		var err error
		switch {
		case rw.lease != nil:
			in, err = rw.joinLease(ctx)
		case rw.leasing != nil:
			in, err = rw.awaitLeasing(ctx, rw.leasing)
		default:
			h, w, shared, drained := rw.w.enterShared(true, rw.sharesWrite())
			switch {
			case shared:
				rw.mu.Unlock()
				if h != nil {
					return nil
				}
				return rw.w.awaitShared(ctx, w)
			case drained != nil:
				// Readers under the write lock: the lease waits for them.
				rw.mu.Unlock()
				err = awaitClose(ctx, drained)
			default:
				return rw.newLease(ctx)
			}
		}
		if in || err != nil {
			return err
		}
	}
}

// joinLease lets a reader join the lease this process holds if no writer
// waits; otherwise it waits until it may look again. The caller holds
// rw.mu, and rw.lease is set; joinLease returns without rw.mu.
func (rw *NetRWMutex) joinLease(ctx context.Context) (joined bool, err error) {
	if rw.joinable() {
		rw.readers++
		rw.mu.Unlock()
		return true, nil
	}
	if rw.recheckDue {
		rw.recheckDue = false
		lease := rw.lease
		rw.mu.Unlock()
		rw.recheck(lease)
		return false, nil
	}
	return false, rw.awaitJoinable(ctx)
}

// awaitLeasing waits for the lease another reader of this process is
// acquiring (leasing), and joins it. The caller holds rw.mu; awaitLeasing
// returns without it.
func (rw *NetRWMutex) awaitLeasing(ctx context.Context, leasing chan struct{}) (joined bool, err error) {
	rw.mu.Unlock()
	if err := awaitClose(ctx, leasing); err != nil {
		return false, err
	}
	// The readers that waited for a lease being acquired came before any
	// writer its acquire found waiting (that writer came after the
	// acquire, in Redis's order): they share it, as sync.RWMutex lets in
	// every reader waiting when a writer leaves.
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.lease != nil && rw.leaseFrom == leasing && ctx.Err() == nil {
		if _, held := rw.lease.deadline(); held {
			rw.readers++
			return true, nil
		}
	}
	return false, nil
}

// newLease acquires a read lease in Redis for this process's readers. The
// caller holds rw.mu; newLease returns without it.
func (rw *NetRWMutex) newLease(ctx context.Context) error {
	leasing := make(chan struct{})
	rw.leasing = leasing
	rw.mu.Unlock()

	listen := rw.newLeaseWatch()
	err := rw.r.lockCtx(ctx)

	rw.mu.Lock()
	rw.leasing = nil
	close(leasing)
	if err == nil {
		rw.leased(listen, leasing)
	}
	rw.mu.Unlock()
	if err != nil {
		listen.stop()
	}
	return err
}

// leased records the read lease just acquired (or handed over) for the
// calling reader, and the watch that listens while it is held. The caller
// holds rw.mu.
func (rw *NetRWMutex) leased(listen *leaseWatch, from chan struct{}) {
	rw.leaseFrom = from
	rw.lease = rw.r.current()
	rw.readers = 1
	rw.leaseEnd = make(chan struct{})
	rw.listen = listen
}

// joinable reports whether a reader may join the lease: no writer of this
// process waits, none of another process is known to, and the lease is
// still held. The caller holds rw.mu, and rw.lease is set.
func (rw *NetRWMutex) joinable() bool {
	rw.lookLocked()
	if rw.writers > 0 || rw.lease.writerWaits.Load() {
		return false
	}
	_, held := rw.lease.deadline()
	return held
}

// runlock is RUnlockCtx: of a reader on the lease, or under the write lock.
func (rw *NetRWMutex) runlock(ctx context.Context) error {
	now := rw.w.clk.Now()
	rw.mu.Lock()
	if rw.readers == 0 {
		rw.mu.Unlock()
		// Not on a lease: on the write lock, or not read-locked.
		if rw.w.sharedHeld() {
			rw.sections.leave(now)
		}
		return rw.w.unlock(ctx, true)
	}
	rw.sections.leave(now)
	rw.readers--
	if rw.readers > 0 {
		rw.mu.Unlock()
		return nil
	}
	rw.lookLocked()
	lease, end, listen := rw.lease, rw.leaseEnd, rw.listen
	rw.lease, rw.leaseEnd, rw.listen = nil, nil, nil
	rw.recheckDue = false
	writerWaits := rw.writers > 0 || lease.writerWaits.Load()
	rw.mu.Unlock()
	listen.stop()
	if writerWaits {
		// A reader of this process waiting for the lease must not be
		// handed it: it queues in Redis, behind the writer.
		rw.r.noHandOff()
	}
	err := rw.r.unlockCtx(ctx)
	close(end)
	return err
}

// awaitClose waits until ch is closed or ctx ends; then it returns an error
// matching ErrNotObtained and ctx's cause.
func awaitClose(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return notObtained(context.Cause(ctx))
	}
}

// A sectionMeter measures the mean length of a process's read sections
// without pairing an RLock with its RUnlock (any goroutine may undo a read
// lock): by Little's law, as the time integral of the number of readers
// inside over the number of sections that ended.
type sectionMeter struct {
	mu     sync.Mutex
	inside int
	last   time.Time
	area   time.Duration // Σ readers inside × time, since the last sample
	ended  int           // sections ended since the last sample
	avg    atomic.Int64  // the mean, in ns, over the recent samples; 0 until measured
}

// sectionSample: sections per sample of a sectionMeter's mean.
const sectionSample = 16

func (s *sectionMeter) enter(now time.Time) {
	s.mu.Lock()
	s.addLocked(now)
	s.inside++
	s.mu.Unlock()
}

func (s *sectionMeter) leave(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(now)
	s.inside = max(s.inside-1, 0)
	if s.ended++; s.ended < sectionSample {
		return
	}
	sample := int64(s.area) / int64(s.ended)
	if old := s.avg.Load(); old > 0 {
		sample = (3*old + sample) / 4
	}
	s.avg.Store(max(sample, 1))
	s.area, s.ended = 0, 0
}

func (s *sectionMeter) addLocked(now time.Time) {
	if s.inside > 0 {
		s.area += time.Duration(s.inside) * now.Sub(s.last)
	}
	s.last = now
}

// mean returns the mean read section; 0 until measured.
func (s *sectionMeter) mean() time.Duration { return time.Duration(s.avg.Load()) }

// What lua/rw_acquire.lua and lua/rw_leave.lua publish on p{name}:rw:joined.
const (
	rwJoined = "j" // a writer took its place
	rwLeft   = "l" // a writer gave its place up
)
