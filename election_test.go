package netlock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// A campaigner leads until it resigns; the next, waiting, leads then with a
// higher term; Proclaim changes the value, not the term; Leader tells it
// all, and ErrNoLeader when nobody leads.
func TestElectionCampaignProclaimResign(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		a, b := e.newElection(t, "el"), e.newElection(t, "el")
		if _, err := a.Leader(context.Background()); !errors.Is(err, ErrNoLeader) {
			t.Fatalf("Leader before any campaign: got %v, want ErrNoLeader", err)
		}
		mustCampaign(t, a, "a:1")
		la := mustLeader(t, b)
		if la.Value != "a:1" || la.Term == 0 || la.Term != a.Term() {
			t.Fatalf("Leader after a's Campaign: got %+v, want a:1 with a's term %d", la, a.Term())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		bDone := campaign(ctx, b, "b:1")
		eventually(t, 5*time.Second, "b queued", func() bool { return e.zcard(t, b) == 1 })
		if err := a.Proclaim(context.Background(), "a:2"); err != nil {
			t.Fatalf("Proclaim: %v", err)
		}
		if l := mustLeader(t, b); l != (Leader{Value: "a:2", Term: la.Term}) {
			t.Fatalf("Leader after Proclaim: got %+v, want a:2 in term %d", l, la.Term)
		}
		select {
		case err := <-bDone:
			t.Fatalf("b's Campaign returned %v while a leads", err)
		default:
		}
		if err := a.Resign(context.Background()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		if err := <-bDone; err != nil {
			t.Fatalf("b's Campaign: %v", err)
		}
		lb := mustLeader(t, a)
		if lb.Value != "b:1" || lb.Term <= la.Term || lb.Term != b.Term() {
			t.Fatalf("Leader after a resigned: got %+v, want b:1 with a term above %d", lb, la.Term)
		}
		if err := a.Proclaim(context.Background(), "a:3"); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("Proclaim by a after Resign: got %v, want ErrNotLeader", err)
		}
		if err := b.Resign(context.Background()); err != nil {
			t.Fatalf("b's Resign: %v", err)
		}
		if _, err := a.Leader(context.Background()); !errors.Is(err, ErrNoLeader) {
			t.Fatalf("Leader after every leader resigned: got %v, want ErrNoLeader", err)
		}
	})
}

// zcard returns the number of campaigners queued for el's leadership.
func (e *env) zcard(t testing.TB, el *Election) int {
	t.Helper()
	n, err := redis.Int(e.do(t, "ZCARD", el.keys.Waiters), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Terms strictly increase from leader to leader, and campaigners are
// elected in the order they arrived.
func TestElectionTermsIncreaseInArrivalOrder(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const n = 4
		first := e.newElection(t, "order")
		mustCampaign(t, first, "first")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		els := make([]*Election, n)
		dones := make([]<-chan error, n)
		for i := range n {
			els[i] = e.newElection(t, "order")
			dones[i] = campaign(ctx, els[i], string(rune('a'+i)))
			eventually(t, 5*time.Second, "campaigner queued", func() bool { return e.zcard(t, first) == i+1 })
		}
		last := first.Term()
		if err := first.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := <-dones[i]; err != nil {
				t.Fatalf("campaigner %d: %v", i, err)
			}
			l := mustLeader(t, els[i])
			if l.Value != string(rune('a'+i)) || l.Term <= last {
				t.Fatalf("leader %d: got %+v, want %q with a term above %d", i, l, string(rune('a'+i)), last)
			}
			last = l.Term
			if err := els[i].Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A Campaign cancelled while it waits returns the context's error and
// leaves no place in the queue; the leader's Resign then leaves nobody
// leading.
func TestElectionCancelledCampaignLeavesNoPlace(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		leader, waiter := e.newElection(t, "cancel"), e.newElection(t, "cancel")
		mustCampaign(t, leader, "leader")
		ctx, cancel := context.WithCancel(context.Background())
		done := campaign(ctx, waiter, "waiter")
		eventually(t, 5*time.Second, "waiter queued", func() bool { return e.zcard(t, leader) == 1 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotObtained) {
			t.Fatalf("cancelled Campaign: got %v, want context.Canceled and ErrNotObtained", err)
		}
		if n := e.zcard(t, leader); n != 0 {
			t.Fatalf("queue after the cancelled Campaign: got %d campaigners, want 0", n)
		}
		if err := leader.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := leader.Leader(context.Background()); !errors.Is(err, ErrNoLeader) {
			t.Fatalf("Leader after Resign with the waiter gone: got %v, want ErrNoLeader", err)
		}
		if waiter.Term() != 0 {
			t.Fatalf("cancelled campaigner's Term: got %d, want 0", waiter.Term())
		}
	})
}

// A leader whose hold is not extended loses its leadership by the local
// clock: Lost closes, Proclaim and Resign say so, and nobody leads in
// Redis once the key expired there.
func TestElectionLostOnExpiry(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		// A node timeout of its own: the default, a tenth of the expiry,
		// is tight for a loaded machine.
		const expiry = 500 * time.Millisecond
		el := e.newElection(t, "lost", WithExpiry(expiry), WithNodeTimeout(200*time.Millisecond), WithAutoExtend(false))
		mustCampaign(t, el, "short")
		lost := el.Lost()
		select {
		case <-lost:
			t.Fatal("Lost closed at once")
		default:
		}
		select {
		case <-lost:
		case <-time.After(10 * expiry):
			t.Fatalf("Lost not closed within %v of an expiry of %v", 10*expiry, expiry)
		}
		if err := el.Proclaim(context.Background(), "late"); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("Proclaim after the loss: got %v, want ErrNotLeader", err)
		}
		if e.mini != nil {
			e.mini.FastForward(expiry)
		}
		eventually(t, 5*time.Second, "no leader in Redis", func() bool {
			_, err := el.Leader(context.Background())
			return errors.Is(err, ErrNoLeader)
		})
		if err := el.Resign(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Fatalf("Resign after the loss: got %v, want ErrLockLost", err)
		}
		// Lost and re-elected: a new Campaign leads again, in a new term.
		mustCampaign(t, el, "again")
		if l := mustLeader(t, el); l.Value != "again" {
			t.Fatalf("Leader after a new Campaign: got %+v, want again", l)
		}
		if err := el.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Bad input: each case returns a clear error at once.
func TestElectionBadInput(t *testing.T) {
	mini := miniEnv(t)
	b := mini.backend(t)
	if _, err := NewElection("", []Backend{b}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("NewElection with an empty name: got %v, want an error saying so", err)
	}
	if _, err := NewElection("x", nil); err == nil {
		t.Error("NewElection without backends: got nil error")
	}
	if _, err := NewElection("x", []Backend{b}, WithFencing(false)); err == nil || !strings.Contains(err.Error(), "WithFencing") {
		t.Errorf("NewElection with WithFencing(false): got %v, want an error naming it", err)
	}
	if _, err := NewElection("x", []Backend{b}, WithMinHold(time.Second)); err == nil || !strings.Contains(err.Error(), "WithMinHold") {
		t.Errorf("NewElection with WithMinHold: got %v, want an error naming it", err)
	}
	el := mini.newElection(t, "bad")
	ctx := context.Background()
	if err := el.Campaign(ctx, ""); err == nil || !strings.Contains(err.Error(), "empty leader value") {
		t.Errorf("Campaign with an empty value: got %v", err)
	}
	big := strings.Repeat("v", MaxLeaderValue+1)
	if err := el.Campaign(ctx, big); err == nil || !strings.Contains(err.Error(), "MaxLeaderValue") {
		t.Errorf("Campaign with %d bytes: got %v", len(big), err)
	}
	if err := el.Proclaim(ctx, "v"); !errors.Is(err, ErrNotLeader) {
		t.Errorf("Proclaim without leading: got %v, want ErrNotLeader", err)
	}
	if err := el.Resign(ctx); !errors.Is(err, ErrNotLeader) {
		t.Errorf("Resign without leading: got %v, want ErrNotLeader", err)
	}
	var zero Election
	if err := zero.Campaign(ctx, "v"); err == nil {
		t.Error("Campaign on the zero Election: got nil error")
	}

	// Campaign twice at once: the second returns at once.
	other := mini.newElection(t, "bad")
	mustCampaign(t, other, "other")
	cctx, cancel := context.WithCancel(ctx)
	done := campaign(cctx, el, "first")
	eventually(t, 5*time.Second, "first Campaign queued", func() bool { return mini.zcard(t, el) == 1 })
	if err := el.Campaign(ctx, "second"); err == nil || !strings.Contains(err.Error(), "under way") {
		t.Errorf("a second Campaign at once: got %v, want an error saying one is under way", err)
	}
	cancel()
	<-done
	// Campaign while leading, and a value too long for Proclaim.
	if err := other.Campaign(ctx, "again"); err == nil || !strings.Contains(err.Error(), "leads already") {
		t.Errorf("Campaign while leading: got %v, want an error saying it leads", err)
	}
	if err := other.Proclaim(ctx, big); err == nil || !strings.Contains(err.Error(), "MaxLeaderValue") {
		t.Errorf("Proclaim with %d bytes: got %v", len(big), err)
	}
	if err := other.Proclaim(ctx, ""); err == nil {
		t.Error("Proclaim with an empty value: got nil error")
	}
	if err := other.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// miniEnv returns an env on a miniredis of its own, with redigo.
func miniEnv(t *testing.T) *env {
	mini := miniredis.RunT(t)
	return &env{mini: mini, client: "redigo", addr: mini.Addr()}
}

// The longest value, in any bytes, comes back as it was given, from
// Leader and from Observe.
func TestElectionValueBytes(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		el := e.newElection(t, "bytes")
		b := make([]byte, MaxLeaderValue)
		for i := range b {
			b[i] = byte(i*7 + i/256)
		}
		for _, v := range []string{"x", "ab:cd:ef", string(b[:7]), string(b[:12]), string(b)} {
			if el.Term() == 0 {
				mustCampaign(t, el, v)
			} else if err := el.Proclaim(context.Background(), v); err != nil {
				t.Fatal(err)
			}
			if l := mustLeader(t, el); l.Value != v {
				t.Fatalf("Leader's value: got %d bytes %q, want %d bytes %q", len(l.Value), trim(l.Value), len(v), trim(v))
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if l := <-el.Observe(ctx); l.Value != string(b) {
			t.Fatalf("Observe's value: got %d bytes, want %d", len(l.Value), len(b))
		}
		if err := el.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func trim(s string) string {
	if len(s) > 20 {
		return s[:20] + "…"
	}
	return s
}

// Observe delivers the leader now first (nobody: the zero Leader), then
// every change by message: a leader, a Proclaim, a Resign, the next leader,
// in order; and closes its channel when ctx ends.
func TestElectionObserve(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		a, b, watcher := e.newElection(t, "obs"), e.newElection(t, "obs"), e.newElection(t, "obs")
		ctx, cancel := context.WithCancel(context.Background())
		ch := watcher.Observe(ctx)
		if l := recv(t, ch, 5*time.Second, "first"); l != (Leader{}) {
			t.Fatalf("first delivery with nobody leading: got %+v, want the zero Leader", l)
		}
		mustCampaign(t, a, "a1")
		la := recv(t, ch, 5*time.Second, "a elected")
		if la != (Leader{Value: "a1", Term: a.Term()}) {
			t.Fatalf("after a's Campaign: got %+v, want a1 in term %d", la, a.Term())
		}
		if err := a.Proclaim(context.Background(), "a2"); err != nil {
			t.Fatal(err)
		}
		if l := recv(t, ch, 5*time.Second, "a's Proclaim"); l != (Leader{Value: "a2", Term: la.Term}) {
			t.Fatalf("after Proclaim: got %+v, want a2 in term %d", l, la.Term)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		bDone := campaign(cctx, b, "b1")
		eventually(t, 5*time.Second, "b queued", func() bool { return e.zcard(t, a) == 1 })
		if err := a.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		l := recv(t, ch, 5*time.Second, "a resigned")
		if l == (Leader{}) { // nobody, until b recorded its value (a reader may miss it)
			l = recv(t, ch, 5*time.Second, "b elected")
		}
		if err := <-bDone; err != nil {
			t.Fatal(err)
		}
		if l != (Leader{Value: "b1", Term: b.Term()}) || l.Term <= la.Term {
			t.Fatalf("after a resigned and b was elected: got %+v, want b1 in term %d, above %d", l, b.Term(), la.Term)
		}
		if err := b.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		if l := recv(t, ch, 5*time.Second, "b resigned"); l != (Leader{}) {
			t.Fatalf("after b resigned: got %+v, want the zero Leader", l)
		}
		cancel()
		for range ch { // closed when ctx ends
		}
	})
}

// A leader that dies (its hold not extended) publishes nothing: Observe
// learns from the lock's TTL that nobody leads, and sees the next leader.
func TestElectionObserveExpiry(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const expiry = 500 * time.Millisecond
		dead := e.newElection(t, "expire", WithExpiry(expiry), WithNodeTimeout(200*time.Millisecond), WithAutoExtend(false))
		watcher := e.newElection(t, "expire")
		mustCampaign(t, dead, "dead")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch := watcher.Observe(ctx)
		if l := recv(t, ch, 5*time.Second, "first"); l.Value != "dead" {
			t.Fatalf("first delivery: got %+v, want dead", l)
		}
		<-dead.Lost()
		if e.mini != nil {
			e.mini.FastForward(expiry)
		}
		if l := recv(t, ch, 5*time.Second, "the leader's hold expired"); l != (Leader{}) {
			t.Fatalf("after the leader's hold expired: got %+v, want the zero Leader", l)
		}
		next := e.newElection(t, "expire")
		mustCampaign(t, next, "next")
		if l := recv(t, ch, 5*time.Second, "next elected"); l.Value != "next" || l.Term != next.Term() {
			t.Fatalf("after the next Campaign: got %+v, want next in term %d", l, next.Term())
		}
		if err := next.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Observe never delivers an older term after a newer one, whatever order
// messages and reads come in: a change older than what a node said last is
// ignored, and a term's end comes after all its values.
func TestElectionObserveNoOlderTerm(t *testing.T) {
	e := miniEnv(t)
	el := e.newElection(t, "order")
	o := newObserver(el, make(chan Leader))
	steps := []struct {
		payload string
		want    Leader // what is to be delivered after it
	}{
		{"l:5:1:1000:a", Leader{"a", 5}},
		{"l:4:9:1000:old", Leader{"a", 5}}, // an older term, late
		{"l:5:3:1000:c", Leader{"c", 5}},
		{"l:5:2:1000:b", Leader{"c", 5}}, // an older revision, late
		{"n:5", Leader{}},
		{"l:5:4:1000:d", Leader{}}, // a value of the ended term, late
		{"l:7:1:1000:x", Leader{"x", 7}},
		{"n:6", Leader{"x", 7}},
	}
	for _, s := range steps {
		o.take(nodeMsg{i: 0, payload: s.payload})
		if o.next != s.want {
			t.Fatalf("after %q: got %+v to deliver, want %+v", s.payload, o.next, s.want)
		}
		o.last, o.delivered, o.pending = o.next, true, false
	}
	// Over a quorum, the majority's view never goes back to an older term
	// either, even when a node still says the older one.
	views := []nodeView{
		{known: true, leads: true, term: 7, rev: 1, value: "x"},
		{known: true, leads: true, term: 6, rev: 1, value: "y"},
		{known: true, leads: true, term: 7, rev: 2, value: "x2"},
	}
	if l, v := majority(views, 2); v != leads || l != (Leader{"x2", 7}) {
		t.Fatalf("majority: got %+v %v, want x2 in term 7 (led on a quorum, the latest value)", l, v)
	}
	views[2] = nodeView{known: true, term: 7}
	if l, v := majority(views, 2); v != nobody {
		t.Fatalf("majority with term 7 led on one node of three: got %+v %v, want nobody", l, v)
	}
	// A node not heard from could make a quorum with the one that leads:
	// who leads cannot be told.
	views[2] = nodeView{}
	if l, v := majority(views, 2); v != unknown {
		t.Fatalf("majority with term 7 led on one node, one not heard from: got %+v %v, want unknown", l, v)
	}
}

// Campaigning costs Redis (almost) nothing while it waits: 20 campaigners,
// each with a client of its own, wait behind a leader with the default
// expiry for longer than an expiry; the commands the server ran meanwhile
// (the leader's extends, scripts' commands counted) come to at most one
// per campaigner-second. Then each is elected in turn.
func TestElectionWaitingCost(t *testing.T) {
	const (
		campaigners = 20
		window      = DefaultExpiry + 2*time.Second
	)
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			newEl := func() *Election {
				el, err := NewElection("cost", []Backend{newBackend(t, client, s.Addr())})
				if err != nil {
					t.Fatal(err)
				}
				return el
			}
			leader := newEl()
			mustCampaign(t, leader, "leader")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var elected atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, campaigners)
			for i := range campaigners {
				el := newEl()
				wg.Go(func() {
					if err := el.Campaign(ctx, strconv.Itoa(i)); err != nil {
						if !errors.Is(err, context.Canceled) {
							errs <- err
						}
						return
					}
					elected.Add(1)
					el.Resign(context.Background())
				})
			}
			eventually(t, 10*time.Second, "all campaigners queued", func() bool {
				v, err := s.Do("ZCARD", leader.keys.Waiters)
				return err == nil && v == strconv.Itoa(campaigners)
			})
			total0, lib0 := commandCounts(t, []*redistest.Server{s})
			time.Sleep(window) // the window the commands are counted over
			total1, lib1 := commandCounts(t, []*redistest.Server{s})
			lib := lib1 - lib0
			ran := total1 - total0 - 1 - lib
			per := float64(ran) / campaigners / window.Seconds()
			redistest.Report(t, "%d campaigners for %v: %d commands of netlock's, %.2f per campaigner-second; the client library's own: %d",
				campaigners, window, ran, per, lib)
			if per > 1 {
				t.Errorf("waiting cost: got %.2f commands per campaigner-second, want at most 1", per)
			}
			if err := leader.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "campaigners elected in turn", func() bool { return elected.Load() == campaigners })
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("Campaign: %v", err)
			}
		})
	}
}

// A Client makes Elections on its backends with its options; each is a
// campaigner of its own, not shared.
func TestElectionClient(t *testing.T) {
	e := miniEnv(t)
	c, err := NewClient([]Backend{e.backend(t)}, WithPrefix("app:"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Election("jobs")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Election("jobs")
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("Client.Election returned one Election twice: want a campaigner each")
	}
	mustCampaign(t, a, "a")
	if l := mustLeader(t, b); l.Value != "a" {
		t.Fatalf("Leader: got %+v, want a", l)
	}
	if !e.exists(t, "app:{jobs}:elect") {
		t.Fatal("the election's lock key is not under the Client's prefix")
	}
	if _, err := c.Election(""); err == nil {
		t.Fatal("Client.Election with an empty name: got nil error")
	}
	if err := a.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Observing costs Redis about one read per expiry while a leader leads:
// 20 observers, each with a client of its own, follow a leader with the
// default expiry for longer than an expiry; the commands the server ran
// meanwhile (the leader's extends, scripts' commands counted) come to at
// most one per observer-second.
func TestElectionObserveCost(t *testing.T) {
	const (
		observers = 20
		window    = DefaultExpiry + 2*time.Second
	)
	s := redistest.Start(t)
	newEl := func() *Election {
		el, err := NewElection("cost", []Backend{newBackend(t, "redigo", s.Addr())})
		if err != nil {
			t.Fatal(err)
		}
		return el
	}
	leader := newEl()
	mustCampaign(t, leader, "leader")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range observers {
		ch := newEl().Observe(ctx)
		if l := recv(t, ch, 5*time.Second, "first"); l.Value != "leader" {
			t.Fatalf("first delivery: got %+v, want leader", l)
		}
		wg.Go(func() {
			for range ch {
			}
		})
	}
	total0, lib0 := commandCounts(t, []*redistest.Server{s})
	time.Sleep(window) // the window the commands are counted over
	total1, lib1 := commandCounts(t, []*redistest.Server{s})
	ran := total1 - total0 - 1 - (lib1 - lib0)
	per := float64(ran) / observers / window.Seconds()
	redistest.Report(t, "%d observers for %v: %d commands of netlock's, %.2f per observer-second", observers, window, ran, per)
	if per > 1 {
		t.Errorf("observing cost: got %.2f commands per observer-second, want at most 1", per)
	}
	cancel()
	wg.Wait()
	if err := leader.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
}
