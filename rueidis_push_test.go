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
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// oneConnRueidis returns a rueidis client on addr with one pipelined
// connection (PipelineMultiplex -1), as a process would have, closed when
// the test ends.
func oneConnRueidis(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true, PipelineMultiplex: -1})
	if err != nil {
		t.Fatalf("rueidis.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// pings returns the server's count of PING calls (INFO commandstats).
func pings(t testing.TB, s *redistest.Server) int64 {
	t.Helper()
	info, err := s.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	v := infoField(info, "cmdstat_ping")
	_, v, _ = strings.Cut(v, "calls=")
	v, _, _ = strings.Cut(v, ",")
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// Waiters of a rueidis client on a server that speaks RESP3 wait on the
// client's own connection: 40 waiters, each on a client of its own with one
// connection, as 40 processes would have, add no connection to the
// server's count while they wait, and no keepalive PING beyond the one a
// client's idle connection is sent anyway (about one a second). Then their
// connections are killed (CLIENT KILL TYPE pubsub): each Hub learns that
// its listener failed, its waiter subscribes again, and every waiter still
// gets the lock once the holder lets go.
func TestRueidisWaitersUseTheirClientsConnection(t *testing.T) {
	const (
		waiters = 40
		window  = 5 * time.Second
	)
	s := redistest.Start(t)
	holder, err := New("push", []Backend{NewRueidis(oneConnRueidis(t, s.Addr()))})
	if err != nil {
		t.Fatal(err)
	}
	mustLock(t, holder)
	ms := make([]*NetMutex, waiters)
	for i := range ms {
		if ms[i], err = New("push", []Backend{NewRueidis(oneConnRueidis(t, s.Addr()))}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var locked atomic.Int64
	errs := make(chan error, waiters)
	for _, m := range ms {
		wg.Go(func() {
			if err := m.LockCtx(ctx); err != nil {
				errs <- err
				return
			}
			locked.Add(1)
			if err := m.UnlockCtx(context.Background()); err != nil {
				errs <- err
			}
		})
	}
	subscribed := func() bool {
		for _, m := range ms {
			v, err := s.Do("PUBSUB", "NUMSUB", m.waitChan)
			if err != nil || !strings.HasSuffix(v, " 1") && !strings.HasSuffix(v, "\n1") {
				return false
			}
		}
		return true
	}
	eventually(t, 10*time.Second, "every waiter subscribed", subscribed)

	// Every client has its one connection, and the INFO asked here one.
	if got, want := connectedClients(s), int64(1+waiters+1); got != want {
		t.Errorf("connections while %d waiters wait: got %d, want %d (one per client, none for waiting)", waiters, got, want)
	}
	p0 := pings(t, s)
	time.Sleep(window) // the window the PINGs are counted over
	perWaiter := float64(pings(t, s)-p0) / waiters / window.Seconds()
	redistest.Report(t, "%d rueidis waiters: %.2f keepalive PINGs per waiter-second over %v", waiters, perWaiter, window)
	// One idle connection per client is pinged about once a second: at
	// most window+1 times in the window; a second connection per waiter
	// would double it.
	if limit := (window.Seconds() + 1) / window.Seconds(); perWaiter > limit {
		t.Errorf("keepalive PINGs while waiting: got %.2f per waiter-second, want at most %.2f (one connection per client)", perWaiter, limit)
	}

	if _, err := s.Do("CLIENT", "KILL", "TYPE", "pubsub"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "every waiter subscribed again", subscribed)
	mustUnlock(t, holder)
	eventually(t, 30*time.Second, "every waiter locked in turn", func() bool { return locked.Load() == waiters })
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("waiter: %v", err)
	}
}

// A rueidisPush listener subscribes on its client's connection, passes the
// messages on, and ends a subscription with UNSUBSCRIBE without failing;
// its Close unsubscribes what is left and leaves the client's connection
// working; a killed connection fails it at once, rueidis's retry on a new
// connection stopped. With one pipelined connection, and with four (the
// SUBSCRIBE and the UNSUBSCRIBE go on the same one).
func TestRueidisPushListener(t *testing.T) {
	for _, multiplex := range []int{-1, 2} {
		t.Run("multiplex="+strconv.Itoa(multiplex), func(t *testing.T) { testRueidisPushListener(t, multiplex) })
	}
}

func testRueidisPushListener(t *testing.T, multiplex int) {
	s := redistest.Start(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true, PipelineMultiplex: multiplex})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if !pushable(context.Background(), c, new(atomic.Int32)) {
		t.Fatal("pushable on Redis over RESP3: false, want true")
	}
	messages := make(chan string, 4)
	listen := func() *rueidisPush {
		l := newRueidisPush(c, func(channel, payload string) { messages <- channel + " " + payload })
		t.Cleanup(l.Close)
		return l
	}
	confirmed := func(l *rueidisPush, want string) {
		t.Helper()
		var got string
		var err error
		redistest.Within(t, 5*time.Second, "Confirmed", func() { got, err = l.Confirmed() })
		if got != want || err != nil {
			t.Fatalf("Confirmed: %q, %v; want %q, nil", got, err, want)
		}
	}
	numsub := func(channel string) string {
		v, err := s.Do("PUBSUB", "NUMSUB", channel)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(v)[1]
	}
	ctx := context.Background()

	l := listen()
	for _, ch := range []string{"a", "b", "c"} {
		if err := l.Subscribe(ctx, ch); err != nil {
			t.Fatal(err)
		}
		confirmed(l, ch)
	}
	if _, err := s.Do("PUBLISH", "b", "hello"); err != nil {
		t.Fatal(err)
	}
	redistest.Within(t, 5*time.Second, "the message", func() {
		if got := <-messages; got != "b hello" {
			t.Errorf("message: got %q, want %q", got, "b hello")
		}
	})
	if err := l.Unsubscribe(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := numsub("a"); got != "0" {
		t.Errorf("subscribers of an unsubscribed channel: got %s, want 0", got)
	}
	l.Close()
	for _, ch := range []string{"b", "c"} {
		if got := numsub(ch); got != "0" {
			t.Errorf("subscribers of %s after Close: got %s, want 0", ch, got)
		}
	}
	if _, err := l.Confirmed(); !errors.Is(err, errHubDown) {
		t.Errorf("Confirmed after Close: %v, want errHubDown", err)
	}
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		t.Errorf("the client after its listener closed: %v", err)
	}

	l = listen()
	if err := l.Subscribe(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	confirmed(l, "d")
	if _, err := s.Do("CLIENT", "KILL", "TYPE", "pubsub"); err != nil {
		t.Fatal(err)
	}
	redistest.Within(t, 5*time.Second, "Confirmed after the connection was killed", func() {
		if _, err := l.Confirmed(); err == nil {
			t.Error("Confirmed after the connection was killed: nil error, want the connection's")
		}
	})
	// rueidis does not subscribe again on its new connection.
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if got := numsub("d"); got != "0" {
		t.Errorf("subscribers of d after the kill: got %s, want 0", got)
	}
}

// A subscription that ends without the listener's UNSUBSCRIBE (another
// user of the client's connection unsubscribed every channel) fails the
// listener: its waiters attempt again.
func TestRueidisPushListenerUnsubscribedByOther(t *testing.T) {
	s := redistest.Start(t)
	c := oneConnRueidis(t, s.Addr())
	l := newRueidisPush(c, func(string, string) {})
	t.Cleanup(l.Close)
	ctx := context.Background()
	if err := l.Subscribe(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	redistest.Within(t, 5*time.Second, "Confirmed", func() {
		if _, err := l.Confirmed(); err != nil {
			t.Fatal(err)
		}
	})
	if err := c.Do(ctx, c.B().Unsubscribe().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	redistest.Within(t, 5*time.Second, "Confirmed after another UNSUBSCRIBE", func() {
		if _, err := l.Confirmed(); !errors.Is(err, errUnasked) {
			t.Errorf("Confirmed: %v, want errUnasked", err)
		}
	})
}

// Where the client's connection cannot carry netlock's subscriptions, the
// Hub keeps a dedicated connection: miniredis runs no script on a
// subscribed connection, and a client speaking RESP2 would subscribe on a
// connection of its own anyway.
func TestRueidisPushableWhere(t *testing.T) {
	s := redistest.Start(t)
	mini := miniredis.RunT(t)
	resp2, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true, AlwaysRESP2: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(resp2.Close)
	for _, tc := range []struct {
		name   string
		client rueidis.Client
		want   bool
	}{
		{"redis/resp3", oneConnRueidis(t, s.Addr()), true},
		{"redis/resp2", resp2, false},
		{"miniredis", oneConnRueidis(t, mini.Addr()), false},
	} {
		var mode atomic.Int32
		if got := pushable(context.Background(), tc.client, &mode); got != tc.want {
			t.Errorf("%s: pushable: got %v, want %v", tc.name, got, tc.want)
		}
		b := NewRueidis(tc.client).(*rueidisBackend)
		l, err := b.listen(context.Background(), func(string, string) {})
		if err != nil {
			t.Fatal(err)
		}
		if _, push := l.(*rueidisPush); push != tc.want {
			t.Errorf("%s: Hub listens on the client's own connection: got %v, want %v", tc.name, push, tc.want)
		}
		l.Close()
	}
}
