package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	cliBinary         = "redis-cli"
	clusterConfigFile = "nodes.conf" // relative to each server's own directory
	clusterSlots      = 16384
	// createTimeout bounds redis-cli --cluster create, which itself waits
	// until the nodes agree on the configuration.
	createTimeout = 60 * time.Second
	// clusterReadyTimeout bounds the wait for cluster_state:ok afterwards. A
	// master reports ok no sooner than about 2s after it started.
	clusterReadyTimeout = 30 * time.Second
)

// Cluster is a Redis Cluster started by StartCluster (masters only) or
// StartClusterReplicas. Each node is a Server, so it can be paused, killed or
// restarted like one; a restarted node keeps its node id and slots, which
// are in the cluster config file in its directory, but not its data.
type Cluster struct {
	t        testing.TB
	servers  []*Server
	addrs    []string
	masters  int
	replicas int // per master
}

// StartCluster starts n (at least 3) cluster-enabled redis-server masters,
// each on a free 127.0.0.1 port with a free cluster bus port, its own
// directory (t.TempDir()) holding its cluster config file, and no
// persistence. It joins them with
//
//	redis-cli --cluster create ADDR... --cluster-replicas 0 --cluster-yes
//
// which spreads the 16384 slots evenly over them, and waits (a bounded time)
// until CLUSTER INFO on every node reports cluster_state:ok, all slots
// assigned and n known nodes. On failure it calls t.Fatalf with the output of
// redis-cli, each node's CLUSTER INFO and the end of each node's log. The
// servers are stopped by t.Cleanup, as with Start.
//
// It calls Require first, and also needs redis-cli on PATH (Debian package
// redis-tools, a dependency of redis-server): without it the test is skipped,
// or fails when NETLOCK_REQUIRE_REDIS=1.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterReplicas(t, n, 0)
}

// StartClusterReplicas is StartCluster with replicas: it starts masters (at
// least 3) plus replicas nodes per master, passing args to every
// redis-server (for example "--cluster-node-timeout", "1000": how long a
// master may be unreachable before a replica takes over), and creates the
// cluster with --cluster-replicas replicas, redis-cli choosing which node
// replicates which master. Besides what StartCluster waits for, it waits
// until every replica's link to its master is up (INFO replication
// master_link_status:up). Which nodes are masters is what ROLE on each
// says; a failover changes it.
func StartClusterReplicas(t testing.TB, masters, replicas int, args ...string) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: StartCluster(%d): a Redis Cluster needs at least 3 masters", masters)
		return nil
	}
	if replicas < 0 {
		t.Fatalf("redistest: StartClusterReplicas(%d, %d): negative replicas", masters, replicas)
		return nil
	}
	Require(t)
	requireCLI(t)
	c := &Cluster{t: t, masters: masters, replicas: replicas}
	for range masters * (1 + replicas) {
		s := start(t, true, append([]string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", clusterConfigFile,
		}, args...))
		c.servers = append(c.servers, s)
		c.addrs = append(c.addrs, s.Addr())
	}
	out, err := c.create()
	if err == nil {
		err = c.waitOK()
	}
	if err != nil {
		t.Fatalf("redistest: start a cluster of %d masters with %d replicas each: %v\n--- redis-cli --cluster create ---\n%s%s",
			masters, replicas, err, strings.TrimRight(out, "\n"), c.report())
		return c
	}
	return c
}

// Addrs returns the nodes' addresses, "127.0.0.1:PORT", in the order of
// Servers. The slice is a copy.
func (c *Cluster) Addrs() []string { return append([]string(nil), c.addrs...) }

// Servers returns the nodes, in the order of Addrs. The slice is a copy.
func (c *Cluster) Servers() []*Server { return append([]*Server(nil), c.servers...) }

// requireCLI is Require for redis-cli.
func requireCLI(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath(cliBinary); err == nil {
		return
	}
	const missing = "redistest: redis-cli not found on PATH; it is needed to create a Redis Cluster " +
		"(Debian/Ubuntu package redis-tools, a dependency of redis-server)"
	if os.Getenv(requireEnv) == "1" {
		t.Fatal(missing + ", and " + requireEnv + "=1 requires a real Redis")
		return
	}
	t.Skip(missing + "; skipping (set " + requireEnv + "=1 to fail instead)")
}

// create runs redis-cli --cluster create and returns its output.
func (c *Cluster) create() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(c.replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cliBinary, args...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s --cluster create did not finish within %v", cliBinary, createTimeout)
	} else if err != nil {
		err = fmt.Errorf("%s --cluster create: %w", cliBinary, err)
	} else if !strings.Contains(out.String(), "All 16384 slots covered") {
		// redis-cli exits 0 even when, for example, a node is not empty.
		err = fmt.Errorf("%s --cluster create did not report all slots covered", cliBinary)
	}
	return ansiEscape.ReplaceAllString(out.String(), ""), err
}

// ansiEscape matches the colour codes redis-cli writes even to a pipe.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;]*m`)

// waitOK waits until every node reports a healthy cluster of all the nodes,
// and every replica is linked to its master.
func (c *Cluster) waitOK() error {
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": strconv.Itoa(clusterSlots),
		"cluster_slots_ok":       strconv.Itoa(clusterSlots),
		"cluster_known_nodes":    strconv.Itoa(len(c.servers)),
		"cluster_size":           strconv.Itoa(c.masters),
	}
	deadline := time.Now().Add(clusterReadyTimeout)
	for _, s := range c.servers {
		for {
			info, err := do(s.addr, probeTimeout, "CLUSTER", "INFO")
			if err == nil {
				err = checkInfo(info, want)
			}
			if err == nil {
				err = checkReplicaLink(s.addr)
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node %s not ready within %v: %w", s.addr, clusterReadyTimeout, err)
			}
			time.Sleep(pollInterval)
		}
	}
	return nil
}

// checkReplicaLink returns an error if the node at addr is a replica whose
// link to its master is not up.
func checkReplicaLink(addr string) error {
	info, err := do(addr, probeTimeout, "INFO", "replication")
	if err != nil {
		return err
	}
	if !strings.Contains(info, "role:slave") {
		return nil
	}
	return checkInfo(info, map[string]string{"master_link_status": "up"})
}

// checkInfo checks fields of a CLUSTER INFO (or INFO) reply.
func checkInfo(info string, want map[string]string) error {
	got := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			got[k] = v
		}
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			errs = append(errs, fmt.Errorf("%s:%s, want %s", k, got[k], want[k]))
		}
	}
	return errors.Join(errs...)
}

// report renders every node's CLUSTER INFO and log tail, for a failure
// message.
func (c *Cluster) report() string {
	var b strings.Builder
	for _, s := range c.servers {
		info, err := do(s.addr, probeTimeout, "CLUSTER", "INFO")
		if err != nil {
			info = fmt.Sprintf("(CLUSTER INFO: %v)", err)
		}
		fmt.Fprintf(&b, "\n--- %s CLUSTER INFO ---\n%s", s.addr, strings.TrimRight(info, "\r\n"))
		fmt.Fprintf(&b, "\n--- %s ---\n%s", s.logPath, s.recentLog())
	}
	return b.String()
}

// recentLog returns the end of the log of the running or most recent process.
func (s *Server) recentLog() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var off int64
	if s.p != nil {
		off = s.p.logOff
	}
	return s.logTail(off)
}
