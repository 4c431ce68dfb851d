package goredis

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock/internal/redistest"
)

// A listener of a Cluster's master confirms a channel only once the node
// has shown that it serves the channel's slot as master, and fails on
// whatever says the slot is elsewhere: a replica accepts SSUBSCRIBE, and
// would hear its master's SPUBLISH uncounted, but answers the check with
// MOVED; a master that does not serve the slot answers SSUBSCRIBE with
// MOVED; and a master whose slot leaves it in a failover unsubscribes the
// channel by itself, which, unlike the confirmation of an SUNSUBSCRIBE the
// Hub sent, fails the listener. (netlock.HubConfig.ListenShard asks all
// this of a Listener.)
func TestShardListener(t *testing.T) {
	cluster := redistest.StartClusterReplicas(t, 3, 1, "--cluster-node-timeout", "1000")
	channel := "netlock:{shard}:released:a"
	var master, replica, other *redistest.Server
	for _, s := range cluster.Servers() {
		_, err := s.Do("EXISTS", channel)
		role := sdo(t, s, "ROLE")
		switch {
		case err == nil:
			master = s
		case strings.HasPrefix(role, "master\n"):
			other = s
		}
	}
	_, port, _ := strings.Cut(master.Addr(), ":")
	for _, s := range cluster.Servers() {
		if strings.Contains(sdo(t, s, "INFO", "replication"), "master_port:"+port+"\r") {
			replica = s
		}
	}
	if master == nil || replica == nil || other == nil {
		t.Fatalf("master %v, its replica %v, another master %v: want all three", master, replica, other)
	}
	var failures atomic.Int32
	listen := func(s *redistest.Server) *listener {
		t.Helper()
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		l := newListener(c.SSubscribe(context.Background()), func(string, string) {}, &shardCheck{master: c, failed: func() { failures.Add(1) }})
		t.Cleanup(l.Close)
		return l
	}
	confirmed := func(l *listener, what string) (ch string, err error) {
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
	err := onOther.Subscribe(ctx, channel)
	if err == nil {
		// go-redis sends without reading: the reply comes to Confirmed.
		_, err = confirmed(onOther, "Confirmed on a master of other slots")
	}
	if err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Errorf("SSUBSCRIBE on a master of other slots: %v, want a MOVED error", err)
	}

	if got := sdo(t, replica, "CLUSTER", "FAILOVER"); got != "OK" {
		t.Fatalf("CLUSTER FAILOVER on %s: %q", replica.Addr(), got)
	}
	if _, err := confirmed(onMaster, "Confirmed on the master after the failover"); !errors.Is(err, errUnsubscribed) {
		t.Errorf("Confirmed on the master after the failover: %v, want errUnsubscribed", err)
	}
	if n := failures.Load(); n != 3 {
		t.Errorf("slot map found stale: %d times, want 3 (replica, other master, failover)", n)
	}
}
