package netlock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// A Listener of a Cluster's master (HubConfig.ListenShard) confirms a
// channel only once the node has shown that it serves the channel's slot as
// master, and fails on whatever says the slot is elsewhere: a replica
// accepts SSUBSCRIBE, and would hear its master's SPUBLISH uncounted, but
// answers the check with MOVED; a master that does not serve the slot
// answers SSUBSCRIBE with MOVED; and a master whose slot leaves it in a
// failover unsubscribes the channel by itself, which, unlike the
// confirmation of an SUNSUBSCRIBE the Hub sent, fails the listener.
func TestShardListener(t *testing.T) {
	cluster := redistest.StartClusterReplicas(t, 3, 1, "--cluster-node-timeout", "1000")
	const name = "shard"
	channel := "netlock:{" + name + "}:released:a"
	master := ownerServer(t, cluster, name)
	replica := replicaOf(t, cluster, master)
	var other *redistest.Server
	for _, s := range masters(t, cluster) {
		if s != master {
			other = s
		}
	}
	var failures atomic.Int32
	listen := func(s *redistest.Server) *rueidisPubSub {
		t.Helper()
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%s): %v", s.Addr(), err)
		}
		t.Cleanup(c.Close)
		dc, _ := c.Dedicate()
		l := newRueidisPubSub(dc, func(string, string) {}, func() { failures.Add(1) })
		t.Cleanup(l.Close)
		return l
	}
	confirmed := func(l *rueidisPubSub, what string) (ch string, err error) {
		t.Helper()
		redistest.Within(t, 10*time.Second, what, func() { ch, err = l.Confirmed() })
		return ch, err
	}
	ctx := context.Background()

	onMaster := listen(master)
	for _, ch := range []string{channel, channel + "-left"} {
		if err := onMaster.Subscribe(ctx, ch); err != nil {
			t.Fatalf("SSUBSCRIBE on the master: %v", err)
		}
		if got, err := confirmed(onMaster, "Confirmed on the master"); got != ch || err != nil {
			t.Fatalf("Confirmed on the master: %q, %v; want %q, nil", got, err, ch)
		}
	}
	if err := onMaster.Unsubscribe(ctx, channel+"-left"); err != nil {
		t.Fatalf("SUNSUBSCRIBE on the master: %v", err)
	}

	onReplica := listen(replica)
	if err := onReplica.Subscribe(ctx, channel); err != nil {
		t.Fatalf("SSUBSCRIBE on the replica: %v (Redis accepts it there)", err)
	}
	if _, err := confirmed(onReplica, "Confirmed on the replica"); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Errorf("Confirmed on the replica: %v, want a MOVED error", err)
	}

	onOther := listen(other)
	if err := onOther.Subscribe(ctx, channel); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Errorf("SSUBSCRIBE on a master of other slots: %v, want a MOVED error", err)
	}

	if got, err := replica.Do("CLUSTER", "FAILOVER"); err != nil || got != "OK" {
		t.Fatalf("CLUSTER FAILOVER on %s: %q, %v", replica.Addr(), got, err)
	}
	if _, err := confirmed(onMaster, "Confirmed on the master after the failover"); !errors.Is(err, errUnsubscribed) {
		t.Errorf("Confirmed on the master after the failover: %v, want errUnsubscribed", err)
	}
	if n := failures.Load(); n != 3 {
		t.Errorf("slot map found stale: %d times, want 3 (replica, other master, failover)", n)
	}
}
