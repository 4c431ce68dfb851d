package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
)

// The holds scenario: one process holding many locks at once, each
// extended by its watchdog, on one server.
const (
	manyHolds = 10000
	// holdsAcquireBound bounds the acquire of every hold: they are taken
	// all at once.
	holdsAcquireBound = 4 * lockExpiry
	// holdsSampleEvery is how often the server's connections and the
	// process's goroutines are sampled.
	holdsSampleEvery = 10 * time.Millisecond
)

// holdsID is the holds scenario's id.
var holdsID = fmt.Sprintf("holds%dk", manyHolds/1000)

// A holdsResult is what one row of the holds scenario measured.
type holdsResult struct {
	holds       int
	acquireTook time.Duration // until every LockCtx had returned
	held        time.Duration // from then until the unlocks began
	lost        int64         // holds lost (Observer.Lost), found while held or at unlock
	gone        int64         // unlocks that found the key gone or taken (ErrLockLost)
	extends     int64         // successful extends while all were held
	peakConns   int           // the server's connected_clients, sampled, the probe's included
	peakRoutine int           // runtime.NumGoroutine while all were held, sampled
	cpu         time.Duration // CPU time of this process while all were held, -1 if unknown
}

func (h *holdsResult) extendsPerSecond() float64 { return float64(h.extends) / h.held.Seconds() }

// wantExtendsPerSecond is what a watchdog extending every third of the
// expiry makes.
func (h *holdsResult) wantExtendsPerSecond() float64 {
	return float64(h.holds) / (lockExpiry / 3).Seconds()
}

// holdsRow: one client of netlock holding manyHolds locks of distinct names
// at once, for the duration its phase is given (-holdfor). Like a waiting
// row, it connects in its phase and checks that nothing of it is left when
// it ends.
func holdsRow(c *contender, addr string) *row {
	return &row{name: c.name, c: c, note: holdsNote(c), setup: func() (func(context.Context, time.Duration, int) result, func(), error) {
		return func(ctx context.Context, holdFor time.Duration, _ int) result {
			return runHolds(ctx, c, addr, holdFor)
		}, func() {}, nil
	}}
}

// fmtCPU renders the CPU the row's process used while it held, in cores.
func fmtCPU(h *holdsResult) string {
	if h.cpu < 0 || h.held <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f cores", h.cpu.Seconds()/h.held.Seconds())
}

func holdsNote(c *contender) string {
	switch c.name {
	case "netlock/redigo":
		return fmt.Sprintf("redigo pool without a bound (MaxActive 0, MaxIdle %d)", poolSize)
	case "netlock/goredis":
		return fmt.Sprintf("go-redis PoolSize %d", poolSize)
	}
	return ""
}

func runHolds(ctx context.Context, c *contender, addr string, holdFor time.Duration) result {
	var res result
	probe, err := dialProbe(addr)
	if err != nil {
		res.addErr(err)
		return res
	}
	defer probe.Close()
	goroutines := runtime.NumGoroutine()
	conns, err := connectedClients(probe)
	if err != nil {
		res.addErr(err)
		return res
	}
	cl, err := c.connect([]string{addr})
	if err != nil {
		res.addErr(err)
		return res
	}
	nc, ok := cl.(*netlockClient)
	if !ok {
		cl.close()
		res.addErr(fmt.Errorf("%s is not netlock", c.name))
		return res
	}
	h := &holdsResult{holds: manyHolds}
	err = holdMany(ctx, nc, probe, holdFor, h, &res)
	cl.close()
	if err != nil {
		res.addErr(err)
		return res
	}
	res.holds = h
	if err := leftovers(probe, goroutines, conns); err != nil {
		res.addErr(err)
	}
	return res
}

// holdMany takes manyHolds locks on nc at once, holds them for holdFor,
// sampling the server's connections and the process's goroutines, and
// unlocks them all at once. Acquires and unlocks that fail go to res.
func holdMany(ctx context.Context, nc *netlockClient, probe redis.Conn, holdFor time.Duration, h *holdsResult, res *result) error {
	var lost, gone, extends atomic.Int64
	var holding atomic.Bool
	opts := []netlock.Option{
		netlock.WithObserver(netlock.Observer{
			Lost: func(netlock.LostHold) { lost.Add(1) },
			Extend: func(_ context.Context, x netlock.ExtendDone) {
				if x.Err == nil && holding.Load() {
					extends.Add(1)
				}
			},
		}),
		// Lost holds are counted, not logged ten thousand times.
		netlock.WithLogger(slog.New(slog.DiscardHandler)),
	}
	ms := make([]*netlock.NetMutex, h.holds)
	for i := range ms {
		m, err := netlock.New(lockName(holdsID, "netlock", 0, i), nc.backends, opts...)
		if err != nil {
			return err
		}
		ms[i] = m
	}

	stop := make(chan struct{})
	var sampler sync.WaitGroup
	var sampleErr error
	sampler.Go(func() {
		t := time.NewTicker(holdsSampleEvery)
		defer t.Stop()
		for {
			n, err := connectedClients(probe)
			if err != nil {
				sampleErr = err
				return
			}
			h.peakConns = max(h.peakConns, n)
			if holding.Load() {
				h.peakRoutine = max(h.peakRoutine, runtime.NumGoroutine())
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})

	var mu sync.Mutex
	addErr := func(err error) {
		mu.Lock()
		res.addErr(err)
		mu.Unlock()
	}
	start := time.Now()
	acquired := make([]bool, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			actx, cancel := context.WithTimeout(ctx, holdsAcquireBound)
			defer cancel()
			if err := m.LockCtx(actx); err != nil {
				addErr(fmt.Errorf("LockCtx: %w", err))
				return
			}
			acquired[i] = true
		})
	}
	wg.Wait()
	h.acquireTook = time.Since(start)

	cpu0 := processCPU()
	holding.Store(true)
	held := time.Now()
	sleepCtx(ctx, holdFor)
	holding.Store(false)
	h.held = time.Since(held)
	h.extends = extends.Load()
	h.cpu = -1
	if cpu0 >= 0 {
		h.cpu = processCPU() - cpu0
	}

	for i, m := range ms {
		if !acquired[i] {
			continue
		}
		wg.Go(func() {
			switch err := m.UnlockCtx(context.Background()); {
			case errors.Is(err, netlock.ErrLockLost):
				gone.Add(1)
			case err != nil:
				addErr(fmt.Errorf("UnlockCtx: %w", err))
			}
		})
	}
	wg.Wait()
	h.lost, h.gone = lost.Load(), gone.Load()
	close(stop)
	sampler.Wait()
	return sampleErr
}
