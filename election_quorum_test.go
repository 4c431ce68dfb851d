package netlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// quorumElection returns an Election over servers, with clients of its own
// (as another process would have).
func quorumElection(t *testing.T, client string, servers []*redistest.Server, name string, opts ...Option) *Election {
	t.Helper()
	backends := make([]Backend, len(servers))
	for i, s := range servers {
		backends[i] = newBackend(t, client, s.Addr())
	}
	el, err := NewElection(name, backends, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return el
}

// Over a quorum of three with a node down, campaigners are elected in turn
// with strictly increasing terms, Proclaim reaches the majority, and Leader
// and Observe tell what the majority holds.
func TestElectionQuorumNodeDown(t *testing.T) {
	for _, client := range testClients() {
		t.Run(client, func(t *testing.T) {
			servers := startServers(t, 3)
			opts := []Option{WithNodeTimeout(150 * time.Millisecond), WithExpiry(2 * time.Second)}
			a := quorumElection(t, client, servers, "q", opts...)
			b := quorumElection(t, client, servers, "q", opts...)
			watcher := quorumElection(t, client, servers, "q", opts...)
			mustCampaign(t, a, "a1")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch := watcher.Observe(ctx)
			if l := recv(t, ch, 5*time.Second, "first"); l != (Leader{Value: "a1", Term: a.Term()}) {
				t.Fatalf("first delivery: got %+v, want a1 in term %d", l, a.Term())
			}
			servers[2].Kill()
			if err := a.Proclaim(context.Background(), "a2"); err != nil {
				t.Fatalf("Proclaim with a node down: %v", err)
			}
			if l := recv(t, ch, 5*time.Second, "a's Proclaim"); l.Value != "a2" || l.Term != a.Term() {
				t.Fatalf("after Proclaim: got %+v, want a2 in term %d", l, a.Term())
			}
			if l := mustLeader(t, b); l.Value != "a2" {
				t.Fatalf("Leader with a node down: got %+v, want a2", l)
			}
			last := a.Term()
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			bDone := campaign(cctx, b, "b1")
			// The leader's watchdog keeps it leading with a node down,
			// across several expiries' worth of extends.
			select {
			case <-a.Lost():
				t.Fatal("a lost its leadership with a minority down")
			case err := <-bDone:
				t.Fatalf("b's Campaign returned %v while a leads", err)
			case <-time.After(3 * time.Second):
			}
			if err := a.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := <-bDone; err != nil {
				t.Fatal(err)
			}
			if b.Term() <= last {
				t.Fatalf("b's term %d, not above a's %d", b.Term(), last)
			}
			l := recv(t, ch, 5*time.Second, "a resigned")
			if l == (Leader{}) {
				l = recv(t, ch, 5*time.Second, "b elected")
			}
			if l != (Leader{Value: "b1", Term: b.Term()}) {
				t.Fatalf("after b was elected: got %+v, want b1 in term %d", l, b.Term())
			}
			if err := b.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
			servers[1].Kill() // a majority down: nobody can be told who leads
			if _, err := watcher.Leader(context.Background()); !errors.Is(err, ErrQuorum) {
				t.Fatalf("Leader with a majority down: got %v, want ErrQuorum", err)
			}
			cancel()
			for range ch {
			}
		})
	}
}

// On a Redis Cluster, through each cluster client, an Election's keys and
// channels share one slot: campaigners are woken, and observers told, by
// sharded messages, on elections whose names land on every master.
func TestElectionCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	names := namesOnEveryMaster(t, cluster, "elect")
	for _, kind := range clusterKinds() {
		t.Run(kind, func(t *testing.T) {
			for _, name := range names {
				newEl := func() *Election {
					el, err := NewElection(name, []Backend{clusterBackend(t, kind, cluster)})
					if err != nil {
						t.Fatal(err)
					}
					return el
				}
				a, b, watcher := newEl(), newEl(), newEl()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				ch := watcher.Observe(ctx)
				if l := recv(t, ch, 5*time.Second, "first"); l != (Leader{}) {
					t.Fatalf("%s: first delivery: got %+v, want the zero Leader", name, l)
				}
				mustCampaign(t, a, "a")
				if l := recv(t, ch, 5*time.Second, "a elected"); l.Value != "a" {
					t.Fatalf("%s: got %+v, want a", name, l)
				}
				bDone := campaign(ctx, b, "b")
				if err := a.Proclaim(ctx, "a2"); err != nil {
					t.Fatal(err)
				}
				if l := recv(t, ch, 5*time.Second, "a's Proclaim"); l.Value != "a2" {
					t.Fatalf("%s: got %+v, want a2", name, l)
				}
				if err := a.Resign(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-bDone; err != nil {
					t.Fatal(err)
				}
				l := recv(t, ch, 5*time.Second, "a resigned")
				if l == (Leader{}) {
					l = recv(t, ch, 5*time.Second, "b elected")
				}
				if l != (Leader{Value: "b", Term: b.Term()}) {
					t.Fatalf("%s: got %+v, want b in term %d", name, l, b.Term())
				}
				if err := b.Resign(ctx); err != nil {
					t.Fatal(err)
				}
				cancel()
				for range ch {
				}
			}
		})
	}
}
