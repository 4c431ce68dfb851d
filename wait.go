package netlock

import (
	"math/rand/v2"
	"time"
)

// backoff is the retry state of one waiting call: never shared between calls.
type backoff struct {
	min, max time.Duration
	n        int // failed attempts so far
	// subscribed: a release will be signalled, the delay is only a safety
	// net (a message lost with a failing connection): no need to start
	// small.
	subscribed bool
}

// next returns the wait before the next attempt: a random duration between
// min and a ceiling that doubles with each attempt up to max (jitter keeps
// waiters that started together from retrying together); when subscribed,
// between max/2 and max. It is capped by
// busy, the holder's remaining TTL when known (busy >= 0): once the key has
// expired there is nothing left to wait for.
func (b *backoff) next(busy time.Duration) time.Duration {
	ceiling := b.max
	if b.subscribed {
		b.n = 20
	}
	if b.n < 20 && b.min < b.max>>b.n { // then min<<n < max: no overflow
		ceiling = b.min << b.n
	}
	b.n++
	floor := b.min
	if b.subscribed {
		floor = max(b.min, ceiling/2)
	}
	d := floor + rand.N(ceiling-floor+1)
	if busy >= 0 && d > busy {
		// Just past the expiry: Redis expires keys with 1ms resolution.
		// (Jitter below both min and d-busy: busy plus it cannot overflow.)
		d = busy + rand.N(min(b.min, d-busy))
	}
	return d
}
