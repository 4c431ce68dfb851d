package netlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"pgregory.net/rapid"
)

// electionCampaigners is how many Elections of one name TestElectionProperty
// drives.
const electionCampaigners = 3

// TestElectionProperty drives three campaigners of one election on 1 and 3
// miniredis nodes through random sequences of Campaign (which leads at once
// when nobody leads, and otherwise waits until a short deadline and leaves
// nothing behind), Proclaim, Resign, Leader, and, over three nodes, a node
// going down and coming back with its data. A model says who leads, with
// which value; every answer is checked against it: at most one campaigner
// leads, terms strictly increase from leader to leader, Leader tells the
// model's leader (or ErrNoLeader), and the errors are the documented ones.
// An observer runs throughout: the terms it delivers never decrease, and
// its last delivery is the model's leader once the changes are told.
func TestElectionProperty(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) { newElectionMachine(rt, n).run(rt) })
		})
	}
}

// An electionMachine is one check of TestElectionProperty: the servers, the
// campaigners, the observer, and the model.
type electionMachine struct {
	srvs  []*miniredis.Miniredis
	up    []bool
	pools []*redis.Pool
	els   []*Election

	// The model: who leads (-1: nobody), with which values (one, or two
	// after a Proclaim that reached too few nodes: either may be what a
	// majority holds) and term; the highest term seen. unsure: with a node
	// down, a Resign may have left the lock on a node until the reaper
	// delivers it there, so a Campaign may have to wait. lost: a leader
	// whose leadership ended without Resign, -1 if none.
	leader int
	values []string
	term   uint64
	last   uint64
	unsure bool
	lost   int

	mu       sync.Mutex
	observed []Leader // what the observer delivered, in order
	stop     context.CancelFunc
	done     chan struct{}
}

func newElectionMachine(rt *rapid.T, n int) *electionMachine {
	em := &electionMachine{leader: -1, lost: -1, done: make(chan struct{})}
	for range n {
		s := miniredis.NewMiniRedis()
		if err := s.Start(); err != nil {
			rt.Fatal(err)
		}
		em.srvs, em.up = append(em.srvs, s), append(em.up, true)
	}
	for range electionCampaigners + 1 {
		backends := make([]Backend, n)
		for i, s := range em.srvs {
			pool := newTestPool(s.Addr())
			em.pools = append(em.pools, pool)
			backends[i] = NewRedigo(pool)
		}
		el, err := NewElection("prop", backends)
		if err != nil {
			rt.Fatal(err)
		}
		em.els = append(em.els, el)
	}
	ctx, cancel := context.WithCancel(context.Background())
	em.stop = cancel
	ch := em.els[electionCampaigners].Observe(ctx) // the observer's own Election
	go func() {
		defer close(em.done)
		for l := range ch {
			em.mu.Lock()
			em.observed = append(em.observed, l)
			em.mu.Unlock()
		}
	}()
	return em
}

func (em *electionMachine) run(rt *rapid.T) {
	defer em.cleanup()
	actions := map[string]func(*rapid.T){
		"campaign": em.campaign,
		"proclaim": em.proclaim,
		"resign":   em.resign,
		"leader":   em.checkLeader,
		"":         em.check,
	}
	if len(em.srvs) > 1 {
		actions["node down"] = em.nodeDown
		actions["node up"] = em.nodeUp
	}
	rt.Repeat(actions)
	em.settled(rt)
}

// cleanup resigns the leader, stops the observer and the servers.
func (em *electionMachine) cleanup() {
	for _, el := range em.els {
		el.Resign(context.Background())
	}
	em.stop()
	<-em.done
	for _, p := range em.pools {
		p.Close()
	}
	for _, s := range em.srvs {
		s.Close()
	}
}

func (em *electionMachine) campaign(rt *rapid.T) {
	i := rapid.IntRange(0, electionCampaigners-1).Draw(rt, "campaigner")
	value := "v" + strconv.Itoa(rapid.IntRange(0, 99).Draw(rt, "value"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if em.leader < 0 && !em.unsure {
		// Nobody leads, nobody waits: elected at once (the deadline
		// bounds a hang; the nodes answer well within it).
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
	}
	err := em.els[i].Campaign(ctx, value)
	switch {
	case em.leader == i:
		if err == nil || !strings.Contains(err.Error(), "leads already") {
			rt.Fatalf("Campaign by the leader %d: got %v, want an error saying it leads", i, err)
		}
	case em.leader >= 0 || (em.unsure && err != nil):
		// ErrQuorum instead of ErrNotObtained when the nodes did not
		// answer the last attempt in time (a node down, another slow).
		if !errors.Is(err, context.DeadlineExceeded) || !(errors.Is(err, ErrNotObtained) || errors.Is(err, ErrQuorum)) {
			rt.Fatalf("Campaign by %d while %d leads: got %v, want the deadline, and ErrNotObtained or ErrQuorum", i, em.leader, err)
		}
		em.queueEmpty(rt, i)
	case err != nil:
		rt.Fatalf("Campaign by %d with nobody leading: %v", i, err)
	default:
		term := em.els[i].Term()
		if term <= em.last {
			rt.Fatalf("Campaign by %d: term %d, not above the last term %d", i, term, em.last)
		}
		em.leader, em.values, em.term, em.last = i, []string{value}, term, term
		if em.lost == i {
			em.lost = -1
		}
	}
	em.check(rt)
}

func (em *electionMachine) proclaim(rt *rapid.T) {
	i := rapid.IntRange(0, electionCampaigners-1).Draw(rt, "campaigner")
	value := "p" + strconv.Itoa(rapid.IntRange(0, 99).Draw(rt, "value"))
	err := em.els[i].Proclaim(context.Background(), value)
	switch {
	case em.leader != i:
		if !errors.Is(err, ErrNotLeader) {
			rt.Fatalf("Proclaim by %d, not leading: got %v, want ErrNotLeader", i, err)
		}
	case err != nil && !(em.down() && errors.Is(err, ErrQuorum)):
		rt.Fatalf("Proclaim by the leader %d: %v", i, err)
	case err != nil:
		em.values = []string{em.values[len(em.values)-1], value}
	default:
		em.values = []string{value}
	}
	em.check(rt)
}

func (em *electionMachine) resign(rt *rapid.T) {
	i := rapid.IntRange(0, electionCampaigners-1).Draw(rt, "campaigner")
	err := em.els[i].Resign(context.Background())
	switch {
	case em.lost == i:
		if !errors.Is(err, ErrLockLost) {
			rt.Fatalf("Resign by %d, whose leadership was lost: got %v, want ErrLockLost", i, err)
		}
		em.lost = -1
	case em.leader != i:
		if !errors.Is(err, ErrNotLeader) {
			rt.Fatalf("Resign by %d, not leading: got %v, want ErrNotLeader", i, err)
		}
	case err != nil && !(em.down() && errors.Is(err, ErrQuorum)):
		rt.Fatalf("Resign by the leader %d: %v", i, err)
	default:
		// Not leading afterwards, whatever Resign returned.
		em.leader, em.values, em.term = -1, nil, 0
		em.unsure = em.unsure || err != nil || em.down()
	}
	em.check(rt)
}

// queueEmpty checks that campaigner i, whose Campaign gave up, left no
// place in the queue of any node that is up that a release would give a
// turn to. Its leave takes its member off; but an attempt cut short by the
// deadline may still join on a node after the leave ran there (each
// connection is served apart), as for a NetMutex's waiter: such a member
// is one nobody listens for, which a release skips (lua/handon.lua). So a
// member of i left in a queue must have no listener once the Hub's
// lingering subscription ended.
func (em *electionMachine) queueEmpty(rt *rapid.T, i int) {
	m := em.els[i].m
	for k, srv := range em.srvs {
		if !em.up[k] {
			continue
		}
		eventually(rt, 2*time.Second, fmt.Sprintf("node %d: no place of campaigner %d a release would wake", k, i), func() bool {
			members, err := srv.ZMembers(em.els[i].keys.Waiters)
			if err != nil || !slices.ContainsFunc(members, func(s string) bool { return strings.HasPrefix(s, m.waiterID) }) {
				return true
			}
			return srv.PubSubNumSub(m.waitChan)[m.waitChan] == 0
		})
	}
}

// checkLeader checks that Leader tells the model's leader.
func (em *electionMachine) checkLeader(rt *rapid.T) {
	l, err := em.els[rapid.IntRange(0, electionCampaigners).Draw(rt, "asker")].Leader(context.Background())
	switch {
	case em.down() && errors.Is(err, ErrQuorum):
		// With a node down, the others may not tell.
	case em.leader < 0 && !errors.Is(err, ErrNoLeader) && !(em.unsure && err == nil):
		rt.Fatalf("Leader with nobody leading: got %+v, %v; want ErrNoLeader", l, err)
	case em.leader >= 0 && (err != nil || l.Term != em.term || !slices.Contains(em.values, l.Value)):
		rt.Fatalf("Leader: got %+v, %v; want one of %q in term %d", l, err, em.values, em.term)
	}
}

// check checks the invariants that hold after every step: at most one
// campaigner leads, the model's; the observer's terms never decrease.
func (em *electionMachine) check(rt *rapid.T) {
	if em.leader >= 0 && em.els[em.leader].Term() == 0 {
		// Extends that reached too few nodes, for longer than the
		// expiry: the leadership is lost, by the local clock.
		em.lost, em.leader, em.values, em.term, em.unsure = em.leader, -1, nil, 0, true
	}
	for i, el := range em.els[:electionCampaigners] {
		if leads := el.Term() != 0; leads != (i == em.leader) {
			rt.Fatalf("campaigner %d: Term %d, but the model's leader is %d", i, el.Term(), em.leader)
		}
	}
	em.mu.Lock()
	defer em.mu.Unlock()
	var last uint64
	for _, l := range em.observed {
		if l.Term != 0 && l.Term < last {
			rt.Fatalf("Observe delivered term %d after term %d: %+v", l.Term, last, em.observed)
		}
		last = max(last, l.Term)
	}
}

// settled checks, at the end, that the observer's last delivery is the
// model's leader.
func (em *electionMachine) settled(rt *rapid.T) {
	em.check(rt)
	if em.down() || em.unsure {
		return // the majority may not tell
	}
	eventually(rt, 5*time.Second, fmt.Sprintf("Observe's last delivery: one of %q in term %d", em.values, em.term), func() bool {
		em.mu.Lock()
		defer em.mu.Unlock()
		if len(em.observed) == 0 {
			return false
		}
		l := em.observed[len(em.observed)-1]
		if em.leader < 0 {
			return l == Leader{}
		}
		return l.Term == em.term && slices.Contains(em.values, l.Value)
	})
}

// down reports whether a node is down.
func (em *electionMachine) down() bool { return slices.Contains(em.up, false) }

// nodeDown stops one node, if all are up (a quorum of three stands one
// down).
func (em *electionMachine) nodeDown(rt *rapid.T) {
	for _, up := range em.up {
		if !up {
			return
		}
	}
	k := rapid.IntRange(0, len(em.srvs)-1).Draw(rt, "node")
	em.srvs[k].Close()
	em.up[k] = false
}

// nodeUp brings a node that is down back, with its data.
func (em *electionMachine) nodeUp(rt *rapid.T) {
	for k, up := range em.up {
		if !up {
			if err := em.srvs[k].Restart(); err != nil {
				rt.Fatalf("restart node %d: %v", k, err)
			}
			em.up[k] = true
		}
	}
}

// newTestPool returns a redigo pool on addr, for a test that closes it. A
// connection is tried before it is used: one left idle by a server that
// restarted is dialled again rather than failing a call.
func newTestPool(addr string) *redis.Pool {
	return &redis.Pool{
		MaxIdle: 4,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr)
		},
		TestOnBorrow: func(c redis.Conn, _ time.Time) error {
			_, err := c.Do("PING")
			return err
		},
	}
}
