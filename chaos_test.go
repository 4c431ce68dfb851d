package netlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// soakEnv sets how long TestChaos runs, as a Go duration ("10m"); without
// it, chaosCI.
const soakEnv = "NETLOCK_SOAK"

const (
	chaosCI      = 20 * time.Second
	chaosNodes   = 5
	chaosClients = 8
	chaosExpiry  = time.Second
	// chaosSlack is how late after a hold's local deadline Lost() may be seen
	// closed: two goroutines (the watchdog, the test's watcher) must be
	// scheduled on a loaded machine, under the race detector. The longest
	// stall of the whole process that stallProbe saw meanwhile is added.
	chaosSlack = 100 * time.Millisecond
)

// chaosDuration returns how long TestChaos runs.
func chaosDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv(soakEnv)
	if v == "" {
		return chaosCI
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 10m", soakEnv, v)
	}
	return d
}

// TestChaos runs eight clients, each with its own connections (four redigo,
// four rueidis), against one quorum lock on five real redis-servers (AOF,
// fsync always, so fence counters survive a crash), each client reaching
// each server through a toxiproxy of its own. While they lock, write to a
// fenced resource and unlock, faults hit a random minority of the servers
// (one or two), one kind at a time in shuffled rounds:
//
//   - pause: SIGSTOP, then SIGCONT after up to 1.5 expiries;
//   - kill: SIGKILL, and a restart (from the AOF) only after the expiry;
//   - latency: toxiproxy latency of 20-300ms with jitter, beyond the node
//     timeout (100ms) at times, on the links of some or all clients;
//   - blackhole: the links of some or all clients drop everything, and are
//     cut (connections closed) when it ends;
//   - reset: the links of some or all clients are reset at their next data;
//
// and now and then a client stalls inside its critical section for longer
// than the expiry with its network frozen (a process pause, as in a GC
// pause): its hold is lost meanwhile, and it writes with its old token when
// it wakes.
//
// The history (client, token, start, end, Lost) is checked by checkHistory:
// no overlap between holds never reported lost, tokens strictly increasing,
// every stale write rejected, every loss signalled by Lost() in time. Errors
// must be the documented sentinels. The figures are logged and reported.
//
// It runs chaosCI by default; NETLOCK_SOAK=10m runs it for ten minutes (add
// -timeout 30m).
func TestChaos(t *testing.T) {
	duration := chaosDuration(t)
	servers := startServers(t, chaosNodes, "--appendonly", "yes", "--appendfsync", "always")
	x := redistest.NewToxiproxy(t)
	links := make([][]*redistest.ToxiProxy, chaosClients) // [client][node]
	ms := make([]*NetMutex, chaosClients)
	// Registered before the clients, so it runs after they are closed.
	t.Cleanup(func() { waitReapersDone(t, ms) })
	for i := range ms {
		client := []string{"redigo", "rueidis"}[i%2]
		backends := make([]Backend, chaosNodes)
		for k, s := range servers {
			p := x.Proxy(s.Addr())
			links[i] = append(links[i], p)
			backends[k] = newBackend(t, client, p.Addr())
		}
		m, err := New("chaos", backends, WithExpiry(chaosExpiry), WithNodeTimeout(100*time.Millisecond),
			// A tenth of the expiry: on this machine, under the race
			// detector, a goroutine may be scheduled tens of milliseconds
			// late, and the drift allowance is the margin between a
			// hold's local deadline and its keys' expiry.
			WithDriftFactor(0.1), WithRetryDelay(time.Millisecond, 20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ms[i] = m
	}

	var (
		resource fencedResource
		mu       sync.Mutex // guards holds and errs
		holds    []holdRecord
		errs     = map[string]int{}
		stalls   atomic.Int64
	)
	stall := make([]atomic.Bool, chaosClients) // set by the fault loop, taken by the client
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var probe stallProbe
	wg.Go(func() { probe.run(ctx) })
	for i, m := range ms {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err := m.LockCtx(lctx)
				cancel()
				if err != nil {
					mu.Lock()
					errs["lock: "+errKind(err)]++
					mu.Unlock()
					continue
				}
				h := holdRecord{client: i, token: m.Token(), start: time.Now()}
				lost := m.Lost()
				h.validAtStart = isOpen(lost)
				watched := make(chan struct{})
				go func() {
					defer close(watched)
					<-lost // closed at the latest by UnlockCtx
					h.lostAt = time.Now()
				}()
				mu.Lock()
				id := len(holds)
				holds = append(holds, holdRecord{}) // filled in below
				mu.Unlock()

				resource.write(id, h.token)
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				if stall[i].CompareAndSwap(true, false) {
					h.paused = true
					stalls.Add(1)
					pauseClient(t, links[i], chaosExpiry*3/2+time.Duration(rng.IntN(500))*time.Millisecond)
				}
				resource.write(id, h.token)
				h.end = time.Now()
				h.validAtEnd = isOpen(lost)
				h.until = holdUntil(m)
				h.unlockStart = time.Now()
				h.unlockErr = m.UnlockCtx(context.Background())
				<-watched
				mu.Lock()
				holds[id] = h
				if h.unlockErr != nil {
					errs["unlock: "+errKind(h.unlockErr)]++
				}
				mu.Unlock()
			}
		})
	}

	// Faults, from the test goroutine as redistest requires.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	faults := map[string]int{}
	kinds := []string{"pause", "kill", "latency", "blackhole", "reset"}
	start := time.Now()
	for episode := 0; time.Since(start) < duration; episode++ {
		if episode%len(kinds) == 0 {
			rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		}
		kind := kinds[episode%len(kinds)]
		victims := rng.Perm(chaosNodes)[:1+rng.IntN(2)]
		clients := rng.Perm(chaosClients)[:1+rng.IntN(chaosClients)]
		hold := time.Duration(50+rng.IntN(1500)) * time.Millisecond
		faults[kind] += len(victims)
		switch kind {
		case "pause":
			for _, v := range victims {
				servers[v].Pause()
			}
			time.Sleep(hold)
			for _, v := range victims {
				servers[v].Resume()
			}
		case "kill":
			for _, v := range victims {
				servers[v].Kill()
			}
			time.Sleep(chaosExpiry + time.Duration(rng.IntN(500))*time.Millisecond)
			for _, v := range victims {
				servers[v].Restart()
			}
		case "latency", "blackhole", "reset":
			var toxic redistest.Toxic
			switch kind {
			case "latency":
				toxic = redistest.Latency("upstream", 20+rng.IntN(280), rng.IntN(50))
			case "blackhole":
				toxic = redistest.Blackhole("upstream")
			case "reset":
				toxic = redistest.ResetPeer("upstream", rng.IntN(20))
			}
			for _, c := range clients {
				for _, v := range victims {
					if err := links[c][v].Add(kind, toxic); err != nil {
						t.Fatal(err)
					}
				}
			}
			time.Sleep(hold)
			for _, c := range clients {
				for _, v := range victims {
					if kind == "blackhole" {
						if err := links[c][v].Cut(kind); err != nil {
							t.Fatal(err)
						}
					} else {
						links[c][v].Remove(kind)
					}
				}
			}
		}
		if episode%4 == 3 {
			stall[rng.IntN(chaosClients)].Store(true)
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
	}
	stop()
	wg.Wait()
	elapsed := time.Since(start)

	violations, fig := checkHistory(holds, resource.writes, func(from, to time.Time) time.Duration {
		return chaosSlack + probe.longest(from, to)
	})
	for _, e := range slices.Sorted(maps.Keys(errs)) {
		if strings.Contains(e, "UNDOCUMENTED") {
			violations = append(violations, fmt.Sprintf("%d times %s", errs[e], e))
		}
	}
	for _, h := range holds {
		if h.token == 0 {
			violations = append(violations, fmt.Sprintf("client %d held with token 0", h.client))
		}
	}
	reportFigures(t, "%v, %d clients on %d servers: %d acquisitions, %d lost, %d stale writes rejected, latest Lost() %v after until (longest process stall %v); faults (servers hit, by kind) %v, client stalls %d; errors %v; violations %d",
		elapsed.Round(time.Second), chaosClients, chaosNodes, fig.holds, fig.lost, fig.staleRejected, fig.maxLate.Round(time.Millisecond), probe.longest(start, time.Now()).Round(time.Millisecond), faults, stalls.Load(), errs, len(violations))
	for i, h := range holds {
		if late := h.lostAt.Sub(h.until); h.signalled() && late > chaosSlack/2 {
			t.Logf("hold %d: client %d (%s), paused %v: held %v, Lost() %v after until, process stalled %v meanwhile, unlock %v",
				i, h.client, []string{"redigo", "rueidis"}[h.client%2], h.paused, h.end.Sub(h.start), late,
				probe.longest(h.until, h.lostAt), h.unlockErr)
		}
	}
	for i, v := range violations {
		if i == 20 {
			t.Errorf("... and %d more", len(violations)-i)
			break
		}
		t.Error(v)
	}
	if fig.holds < 10 {
		t.Errorf("only %d acquisitions: the lock made no progress with a minority of servers faulty", fig.holds)
	}
}

// stallProbe measures how long the test process goes without being
// scheduled: it sleeps 2ms at a time and records every sleep that took much
// longer.
type stallProbe struct {
	mu     sync.Mutex
	stalls []stall
}

type stall struct{ from, to time.Time }

func (p *stallProbe) run(ctx context.Context) {
	const nap = 2 * time.Millisecond
	for ctx.Err() == nil {
		from := time.Now()
		time.Sleep(nap)
		if to := time.Now(); to.Sub(from) > nap+5*time.Millisecond {
			p.mu.Lock()
			p.stalls = append(p.stalls, stall{from, to})
			p.mu.Unlock()
		}
	}
}

// longest returns the longest stall that overlaps [from, to].
func (p *stallProbe) longest(from, to time.Time) (d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.stalls {
		if s.from.Before(to) && s.to.After(from) {
			d = max(d, s.to.Sub(s.from))
		}
	}
	return d
}

// pauseClient simulates a process pause of d (a stop-the-world GC, a
// suspended VM) for the client whose links these are: nothing it sends is
// delivered, so its watchdog cannot extend and its hold lapses, while the
// calling goroutine, inside the critical section, sleeps.
func pauseClient(t *testing.T, links []*redistest.ToxiProxy, d time.Duration) {
	for _, p := range links {
		if err := p.Add("stall", redistest.Latency("upstream", int(10*chaosExpiry/time.Millisecond), 0)); err != nil {
			t.Error(err)
		}
	}
	time.Sleep(d)
	for _, p := range links {
		p.Remove("stall") // what was held back is delivered now, late
	}
}

// waitReapersDone waits until no reaper of ms runs: after their clients
// are closed, each ends at its next pass (every call then fails for good).
func waitReapersDone(t *testing.T, ms []*NetMutex) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, m := range ms {
		for m != nil {
			m.reaper.mu.Lock()
			running, pending := m.reaper.running, len(m.reaper.pending)
			m.reaper.mu.Unlock()
			if !running {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("a reaper still runs 5s after its clients were closed, %d releases pending", pending)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// holdUntil returns the local deadline of m's current hold (zero if none).
func holdUntil(m *NetMutex) time.Time {
	if h := m.current(); h != nil {
		until, _ := h.deadline()
		return until
	}
	return time.Time{}
}

// isOpen reports whether c is not closed.
func isOpen(c <-chan struct{}) bool {
	select {
	case <-c:
		return false
	default:
		return true
	}
}

// errKind names an error by the sentinels it matches, for counting.
func errKind(err error) string {
	var kinds []string
	for _, s := range []struct {
		err  error
		name string
	}{
		{ErrNotObtained, "ErrNotObtained"}, {ErrNotHeld, "ErrNotHeld"}, {ErrLockLost, "ErrLockLost"},
		{ErrQuorum, "ErrQuorum"}, {context.Canceled, "Canceled"}, {context.DeadlineExceeded, "DeadlineExceeded"},
	} {
		if errors.Is(err, s.err) {
			kinds = append(kinds, s.name)
		}
	}
	if len(kinds) == 0 {
		return "UNDOCUMENTED " + err.Error()
	}
	return strings.Join(kinds, "+")
}
