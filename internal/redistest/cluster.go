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

// Cluster is a Redis Cluster of masters without replicas, started by
// StartCluster. Each node is a Server, so it can be paused, killed or
// restarted like one; a restarted node keeps its node id and slots, which
// are in the cluster config file in its directory, but not its data.
type Cluster struct {
	t       testing.TB
	servers []*Server
	addrs   []string
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
	if n < 3 {
		t.Fatalf("redistest: StartCluster(%d): a Redis Cluster needs at least 3 masters", n)
		return nil
	}
	Require(t)
	requireCLI(t)
	c := &Cluster{t: t}
	for range n {
		s := start(t, true, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", clusterConfigFile,
		})
		c.servers = append(c.servers, s)
		c.addrs = append(c.addrs, s.Addr())
	}
	out, err := c.create()
	if err == nil {
		err = c.waitOK()
	}
	if err != nil {
		t.Fatalf("redistest: start a %d-node cluster: %v\n--- redis-cli --cluster create ---\n%s%s",
			n, err, strings.TrimRight(out, "\n"), c.report())
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
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
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

// waitOK waits until every node reports a healthy cluster of all the nodes.
func (c *Cluster) waitOK() error {
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": strconv.Itoa(clusterSlots),
		"cluster_slots_ok":       strconv.Itoa(clusterSlots),
		"cluster_known_nodes":    strconv.Itoa(len(c.servers)),
		"cluster_size":           strconv.Itoa(len(c.servers)),
	}
	deadline := time.Now().Add(clusterReadyTimeout)
	for _, s := range c.servers {
		for {
			info, err := do(s.addr, probeTimeout, "CLUSTER", "INFO")
			if err == nil {
				err = checkInfo(info, want)
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

// checkInfo checks fields of a CLUSTER INFO reply.
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
