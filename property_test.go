package netlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"pgregory.net/rapid"
)

// lockModel is what the clients of one lock name should see: who holds the
// key on the server and until when (in miniredis time), and what each client
// believes.
type lockModel struct {
	now, expiresAt time.Duration // miniredis time since the start
	holder         int           // client whose value is in the key, or -1
	held, lost     []bool        // per client: has a hold; the hold is known lost
	lastToken      uint64
}

func (lm *lockModel) keyHeld() bool { return lm.holder >= 0 && lm.now < lm.expiresAt }

// TestPropertySingleNode drives several clients of one lock name on one
// miniredis node through random sequences of lock, try, unlock, extend,
// time passing, script flushes and keys deleted behind their back, and checks
// every answer against the model: at most one holder, tokens strictly
// increasing, the documented errors, nothing left behind.
func TestPropertySingleNode(t *testing.T) {
	const expiry = 8 * time.Second
	rapid.Check(t, func(rt *rapid.T) {
		srv := miniredis.NewMiniRedis()
		if err := srv.Start(); err != nil {
			rt.Fatal(err)
		}
		defer srv.Close()
		// Clients 0 and 1 share a pool (one process, two NetMutex objects);
		// client 2 has its own, as another process.
		var pools []*redis.Pool
		newPool := func() Backend {
			p := &redis.Pool{MaxIdle: 4, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", srv.Addr()) }}
			pools = append(pools, p)
			return NewRedigo(p)
		}
		defer func() {
			for _, p := range pools {
				p.Close()
			}
		}()
		shared := newPool()
		backends := []Backend{shared, shared, newPool()}
		// Auto-extend off and a long expiry: the local deadline never passes
		// during a run, so only the server's clock (FastForward) ends holds.
		clients := make([]*NetMutex, len(backends))
		for i, b := range backends {
			m, err := New("prop", []Backend{b}, WithExpiry(expiry), WithAutoExtend(false), WithRetryDelay(time.Millisecond, 2*time.Millisecond))
			if err != nil {
				rt.Fatal(err)
			}
			clients[i] = m
		}
		lm := &lockModel{holder: -1, held: make([]bool, len(clients)), lost: make([]bool, len(clients))}
		defer func() {
			for i, m := range clients {
				if lm.held[i] {
					m.UnlockCtx(context.Background())
				}
			}
		}()
		ctx := context.Background()
		client := rapid.IntRange(0, len(clients)-1)

		acquired := func(rt *rapid.T, i int) {
			tok := clients[i].Token()
			if tok <= lm.lastToken {
				rt.Fatalf("client %d token %d, want above %d", i, tok, lm.lastToken)
			}
			lm.lastToken = tok
			lm.holder, lm.expiresAt = i, lm.now+expiry
			lm.held[i], lm.lost[i] = true, false
		}

		rt.Repeat(map[string]func(*rapid.T){
			"TryLockCtx": func(rt *rapid.T) {
				i := client.Draw(rt, "client")
				ok, err := clients[i].TryLockCtx(ctx)
				if err != nil {
					rt.Fatalf("client %d TryLockCtx: %v", i, err)
				}
				want := !lm.held[i] && !lm.keyHeld()
				if ok != want {
					rt.Fatalf("client %d TryLockCtx: got %v, want %v (holder %d)", i, ok, want, lm.holder)
				}
				if ok {
					acquired(rt, i)
				}
			},
			"LockCtx short deadline": func(rt *rapid.T) {
				i := client.Draw(rt, "client")
				free := !lm.held[i] && !lm.keyHeld()
				wait := 5 * time.Millisecond // held: LockCtx must give up
				if free {
					wait = 10 * time.Second // free: a generous bound on a loaded machine
				}
				dctx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				err := clients[i].LockCtx(dctx)
				if free {
					if err != nil {
						rt.Fatalf("client %d LockCtx on a free lock: %v", i, err)
					}
					acquired(rt, i)
					return
				}
				if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
					rt.Fatalf("client %d LockCtx on a held lock: got %v, want ErrNotObtained and DeadlineExceeded", i, err)
				}
			},
			"UnlockCtx": func(rt *rapid.T) {
				i := client.Draw(rt, "client")
				err := clients[i].UnlockCtx(ctx)
				switch {
				case !lm.held[i]:
					if !errors.Is(err, ErrNotHeld) {
						rt.Fatalf("client %d UnlockCtx without a hold: got %v, want ErrNotHeld", i, err)
					}
				case lm.holder == i && lm.keyHeld() && !lm.lost[i]:
					if err != nil {
						rt.Fatalf("client %d UnlockCtx: %v", i, err)
					}
					lm.holder = -1
				default:
					if !errors.Is(err, ErrLockLost) {
						rt.Fatalf("client %d UnlockCtx of a lapsed hold: got %v, want ErrLockLost", i, err)
					}
					if lm.holder == i {
						lm.holder = -1 // released all the same: the key was still ours
					}
				}
				lm.held[i], lm.lost[i] = false, false
			},
			"ExtendCtx": func(rt *rapid.T) {
				i := client.Draw(rt, "client")
				err := clients[i].ExtendCtx(ctx)
				switch {
				case !lm.held[i]:
					if !errors.Is(err, ErrNotHeld) {
						rt.Fatalf("client %d ExtendCtx without a hold: got %v, want ErrNotHeld", i, err)
					}
				case lm.holder == i && lm.keyHeld() && !lm.lost[i]:
					if err != nil {
						rt.Fatalf("client %d ExtendCtx: %v", i, err)
					}
					lm.expiresAt = lm.now + expiry
				default:
					if !errors.Is(err, ErrLockLost) {
						rt.Fatalf("client %d ExtendCtx of a lapsed hold: got %v, want ErrLockLost", i, err)
					}
					lm.lost[i] = true
					select {
					case <-clients[i].Lost():
					default:
						rt.Fatalf("client %d: ExtendCtx reported ErrLockLost but Lost() is open", i)
					}
				}
			},
			"advance time": func(rt *rapid.T) {
				d := time.Duration(rapid.IntRange(0, 12000).Draw(rt, "ms")) * time.Millisecond
				srv.FastForward(d)
				lm.now += d
				if !lm.keyHeld() {
					lm.holder = -1
				}
			},
			"SCRIPT FLUSH": func(rt *rapid.T) {
				c, err := redis.Dial("tcp", srv.Addr())
				if err != nil {
					rt.Fatal(err)
				}
				defer c.Close()
				if _, err := c.Do("SCRIPT", "FLUSH"); err != nil {
					rt.Fatal(err)
				}
			},
			"delete key behind its back": func(rt *rapid.T) {
				srv.Del("netlock:{prop}")
				lm.holder = -1
			},
			"": func(rt *rapid.T) {
				// Invariant: the server's key belongs to the model's holder.
				if lm.keyHeld() != srv.Exists("netlock:{prop}") {
					rt.Fatalf("key exists: got %v, model says %v", srv.Exists("netlock:{prop}"), lm.keyHeld())
				}
				valid := 0
				for i := range clients {
					if lm.held[i] && !lm.lost[i] && lm.holder == i && lm.keyHeld() {
						valid++
					}
				}
				if valid > 1 {
					rt.Fatalf("%d clients hold a valid lock", valid)
				}
			},
		})
	})
}
