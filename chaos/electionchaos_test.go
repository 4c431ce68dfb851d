package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
)

// electionName is the election of the Election chaos tests.
const electionName = "chaos-election"

// electionLocks returns a client's one lock object: an Election it
// campaigns in (with a value of its own), resigning at the end of each
// term; its term is the fencing token of its writes.
func electionLocks(t *testing.T, backends []netlock.Backend) []multiLock {
	t.Helper()
	b := &deadlineBound{expiry: chaosExpiry - time.Duration(float64(chaosExpiry)*chaosDrift) - 2*time.Millisecond}
	e, err := netlock.NewElection(electionName, backends, netlock.WithExpiry(chaosExpiry), netlock.WithNodeTimeout(100*time.Millisecond),
		netlock.WithDriftFactor(chaosDrift), netlock.WithRetryDelay(time.Millisecond, 20*time.Millisecond),
		netlock.WithObserver(b.observer()), netlock.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	value := fmt.Sprintf("client-%p", e)
	return []multiLock{{
		names:  []string{electionName},
		lock:   func(ctx context.Context) error { return e.Campaign(ctx, value) },
		unlock: e.Resign,
		lost:   e.Lost,
		tokens: func() []uint64 { return []uint64{e.Term()} },
		bound:  b,
	}}
}

var electionSetup = locksSetup{
	what:      "an Election's leaders, fenced by term",
	names:     []string{electionName},
	keys:      []string{lockKey(electionName) + ":elect"},
	locks:     electionLocks,
	contended: true,
}

// TestChaosElection runs TestChaosMulti's faults and checks against eight
// clients that campaign in one Election over three servers: each leader
// writes to a resource fenced by its term, twice, stalling past the expiry
// now and then in between, and resigns. The leaders' history is checked
// as TestChaos's holds' (checkHistory): no two leaders never reported lost
// overlap, terms strictly increase, every write of a deposed leader is
// refused, Lost() closes in time.
func TestChaosElection(t *testing.T) {
	runChaosLocks(t, electionSetup, chaosSetup{
		nodes:   3,
		victims: func(rng *rand.Rand) []int { return []int{rng.IntN(3)} },
		quiet:   func(rng *rand.Rand) time.Duration { return time.Duration(rng.IntN(300)) * time.Millisecond },
	})
}

// TestChaosElectionSingle is TestChaosElection on one server.
func TestChaosElectionSingle(t *testing.T) {
	runChaosLocks(t, electionSetup, chaosSetup{
		nodes:   1,
		victims: func(*rand.Rand) []int { return []int{0} },
		quiet:   func(rng *rand.Rand) time.Duration { return chaosQuiet + time.Duration(rng.Int64N(int64(chaosQuiet))) },
	})
}
