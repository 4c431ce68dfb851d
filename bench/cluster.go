package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

const (
	// clusterMasters is how many masters the Redis Cluster of the
	// several-slot scenarios has.
	clusterMasters = 3
	// clusterBusOffset: a Cluster node listens for its peers on its port
	// plus this.
	clusterBusOffset = 10000
	// clusterCreateTimeout bounds redis-cli --cluster create, which waits
	// until the nodes agree; clusterReadyTimeout the wait for
	// cluster_state:ok on every node afterwards.
	clusterCreateTimeout = 60 * time.Second
	clusterReadyTimeout  = 30 * time.Second
)

// The Redis Cluster of the several-slot scenarios: started by the first row
// that needs it, stopped by stopCluster when the run ends.
var cluster struct {
	once    sync.Once
	servers []*server
	addrs   []string
	err     error
}

// clusterAddrs returns the addresses of the Cluster's masters, starting it
// on first use: clusterMasters redis-servers with --cluster-enabled yes
// (and persisting nothing, as the others), joined by
//
//	redis-cli --cluster create ADDR... --cluster-replicas 0 --cluster-yes
//
// which spreads the slots evenly over them.
func clusterAddrs() ([]string, error) {
	cluster.once.Do(func() {
		for range clusterMasters {
			s, err := startServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
			if err != nil {
				cluster.err = err
				return
			}
			cluster.servers = append(cluster.servers, s)
			cluster.addrs = append(cluster.addrs, s.addr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
		defer cancel()
		args := append(append([]string{"--cluster", "create"}, cluster.addrs...), "--cluster-replicas", "0", "--cluster-yes")
		if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
			cluster.err = fmt.Errorf("redis-cli --cluster create: %w\n%s", err, tail(out, 2000))
			return
		}
		cluster.err = waitClusterOK(cluster.addrs)
		if cluster.err == nil {
			logf("a Redis Cluster of %d masters on %s", clusterMasters, strings.Join(cluster.addrs, ", "))
		}
	})
	return cluster.addrs, cluster.err
}

// waitClusterOK waits until CLUSTER INFO on every node says
// cluster_state:ok.
func waitClusterOK(addrs []string) error {
	deadline := time.Now().Add(clusterReadyTimeout)
	for _, a := range addrs {
		for {
			info, err := clusterInfo(a)
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				return errors.Join(fmt.Errorf("cluster node %s not ok within %v: %q", a, clusterReadyTimeout, info), err)
			}
			time.Sleep(100 * time.Millisecond) // between polls of the node
		}
	}
	return nil
}

func clusterInfo(addr string) (string, error) {
	c, err := dialProbe(addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return redis.String(c.Do("CLUSTER", "INFO"))
}

// stopCluster stops the Cluster's servers, if it was started.
func stopCluster() {
	for _, s := range cluster.servers {
		s.stop()
	}
}
