package redistest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

func TestStartCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)

	addrs, servers := c.Addrs(), c.Servers()
	if len(addrs) != 3 || len(servers) != 3 {
		t.Fatalf("Addrs() = %q, %d Servers()", addrs, len(servers))
	}
	byAddr := map[string]*Server{}
	dirs := map[string]bool{}
	for i, s := range servers {
		if s.Addr() != addrs[i] {
			t.Fatalf("Servers()[%d].Addr() = %q, Addrs()[%d] = %q", i, s.Addr(), i, addrs[i])
		}
		if byAddr[s.Addr()] != nil {
			t.Fatalf("address %s used twice", s.Addr())
		}
		byAddr[s.Addr()] = s
		mustDo(t, s, "cluster-enabled\nyes", "CONFIG", "GET", "cluster-enabled")
		mustDo(t, s, "cluster-config-file\n"+clusterConfigFile, "CONFIG", "GET", "cluster-config-file")
		mustDo(t, s, "save\n", "CONFIG", "GET", "save")
		mustDo(t, s, "appendonly\nno", "CONFIG", "GET", "appendonly")
		dir, err := s.Do("CONFIG", "GET", "dir")
		if err != nil {
			t.Fatal(err)
		}
		if dirs[dir] {
			t.Fatalf("%s shares its directory (%q) with another node", s.Addr(), dir)
		}
		dirs[dir] = true
		info, err := s.Do("CLUSTER", "INFO")
		if err != nil {
			t.Fatal(err)
		}
		if err := checkInfo(info, map[string]string{
			"cluster_state": "ok", "cluster_slots_ok": "16384", "cluster_known_nodes": "3", "cluster_size": "3",
		}); err != nil {
			t.Fatalf("%s CLUSTER INFO: %v\n%s", s.Addr(), err, info)
		}
	}

	// Every node must agree on which node owns each slot.
	owners := slotOwners(t, servers[0])
	for _, s := range servers[1:] {
		if other := slotOwners(t, s); *other != *owners {
			t.Fatalf("%s and %s disagree on the slot map", servers[0].Addr(), s.Addr())
		}
	}
	for slot, a := range owners {
		if byAddr[a] == nil {
			t.Fatalf("slot %d is owned by %q, not a node of the cluster", slot, a)
		}
	}

	// Keys written through the first node, following MOVED, land on the
	// owner and can be read there; every other node redirects to it.
	used := map[string]bool{}
	for i := 0; i < 30 && len(used) < 3; i++ {
		key := "key" + strconv.Itoa(i)
		val := "value" + strconv.Itoa(i)
		got, err := servers[0].Do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatal(err)
		}
		slot, err := strconv.Atoi(got)
		if err != nil || slot < 0 || slot >= clusterSlots {
			t.Fatalf("CLUSTER KEYSLOT %s = %q", key, got)
		}
		owner := owners[slot]
		used[owner] = true

		target := servers[0]
		reply, err := target.Do("SET", key, val)
		if err != nil {
			moved := fmt.Sprintf("MOVED %d %s", slot, owner)
			if err.Error() != moved || target.Addr() == owner {
				t.Fatalf("SET %s on %s: err = %v, want %q", key, target.Addr(), err, moved)
			}
			target = byAddr[owner]
			reply, err = target.Do("SET", key, val)
		}
		if err != nil || reply != "OK" {
			t.Fatalf("SET %s on owner %s = %q, %v", key, owner, reply, err)
		}
		for _, s := range servers {
			got, err := s.Do("GET", key)
			switch {
			case s.Addr() == owner:
				if err != nil || got != val {
					t.Fatalf("GET %s on owner %s = %q, %v; want %q", key, owner, got, err, val)
				}
			default:
				if want := fmt.Sprintf("MOVED %d %s", slot, owner); err == nil || err.Error() != want {
					t.Fatalf("GET %s on %s = %q, %v; want error %q", key, s.Addr(), got, err, want)
				}
			}
		}
	}
	if len(used) != 3 {
		t.Fatalf("30 keys hit only %d nodes", len(used))
	}
}

// slotOwners parses CLUSTER NODES on s into the address serving each slot.
func slotOwners(t *testing.T, s *Server) *[clusterSlots]string {
	t.Helper()
	nodes, err := s.Do("CLUSTER", "NODES")
	if err != nil {
		t.Fatal(err)
	}
	var owners [clusterSlots]string
	for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
		// <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
		f := strings.Fields(line)
		if len(f) < 8 {
			t.Fatalf("CLUSTER NODES line %q", line)
		}
		if !strings.Contains(f[2], "master") || f[7] != "connected" {
			t.Fatalf("%s: node not a connected master: %q", s.Addr(), line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		for _, r := range f[8:] {
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a > b || b >= clusterSlots {
				t.Fatalf("CLUSTER NODES slot range %q in %q", r, line)
			}
			for i := a; i <= b; i++ {
				if owners[i] != "" {
					t.Fatalf("slot %d owned by %s and %s", i, owners[i], addr)
				}
				owners[i] = addr
			}
		}
	}
	for i, a := range owners {
		if a == "" {
			t.Fatalf("%s: slot %d has no owner in CLUSTER NODES:\n%s", s.Addr(), i, nodes)
		}
	}
	return &owners
}

func TestStartClusterTooFewNodes(t *testing.T) {
	t.Parallel()
	f := &fakeTB{TB: t}
	if c := StartCluster(f, 2); c != nil || !f.failed || !strings.Contains(f.msg, "at least 3") {
		t.Fatalf("StartCluster(2) = %v, failed=%v msg=%q", c, f.failed, f.msg)
	}
}

func TestStartClusterReplicas(t *testing.T) {
	t.Parallel()
	c := StartClusterReplicas(t, 3, 1, "--cluster-node-timeout", "1500")
	servers := c.Servers()
	if len(servers) != 6 || len(c.Addrs()) != 6 {
		t.Fatalf("%d Servers(), Addrs() = %q; want 6 of each", len(servers), c.Addrs())
	}
	replicas := map[string]int{} // per master's port
	masters := 0
	for _, s := range servers {
		mustDo(t, s, "cluster-node-timeout\n1500", "CONFIG", "GET", "cluster-node-timeout")
		info, err := s.Do("INFO", "replication")
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.Contains(info, "role:master"):
			masters++
		case strings.Contains(info, "role:slave"):
			if err := checkInfo(info, map[string]string{"master_link_status": "up"}); err != nil {
				t.Errorf("replica %s: %v", s.Addr(), err)
			}
			for line := range strings.SplitSeq(info, "\n") {
				if port, ok := strings.CutPrefix(strings.TrimSpace(line), "master_port:"); ok {
					replicas[port]++
				}
			}
		default:
			t.Fatalf("%s INFO replication without a role:\n%s", s.Addr(), info)
		}
		clusterInfo, err := s.Do("CLUSTER", "INFO")
		if err != nil {
			t.Fatal(err)
		}
		if err := checkInfo(clusterInfo, map[string]string{
			"cluster_state": "ok", "cluster_slots_ok": "16384", "cluster_known_nodes": "6", "cluster_size": "3",
		}); err != nil {
			t.Errorf("%s CLUSTER INFO: %v", s.Addr(), err)
		}
	}
	if masters != 3 || len(replicas) != 3 {
		t.Errorf("%d masters, replicas of %d masters (%v); want 3 masters with a replica each", masters, len(replicas), replicas)
	}
	for port, n := range replicas {
		if n != 1 {
			t.Errorf("master on port %s has %d replicas, want 1", port, n)
		}
	}
}
