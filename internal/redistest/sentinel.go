package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	sentinelBinary   = "redis-sentinel"
	sentinelConfName = "sentinel.conf"
	// SentinelDownAfter is how long the sentinels of StartSentinels wait
	// for a primary that does not answer before they take it for down
	// (down-after-milliseconds; Redis's default is 30s).
	SentinelDownAfter = 1000 * time.Millisecond
	// sentinelFailoverTimeout bounds a failover, and a sentinel waits
	// twice as long after one before it fails the same master over again
	// (failover-timeout; the default is 3 minutes).
	sentinelFailoverTimeout = 2 * time.Second
	// sentinelSettle bounds the wait for the sentinels to know the
	// replicas and one another (they say hello every 2s).
	sentinelSettle = 20 * time.Second
)

// RequireSentinel is Require for redis-sentinel: it skips the test if
// redis-sentinel is not on PATH, or fails it when NETLOCK_REQUIRE_REDIS=1.
func RequireSentinel(t testing.TB) {
	t.Helper()
	Require(t)
	if _, err := exec.LookPath(sentinelBinary); err == nil {
		return
	}
	if os.Getenv(requireEnv) == "1" {
		t.Fatal("redistest: redis-sentinel not found on PATH, but " + requireEnv + "=1 requires it (install redis-sentinel)")
		return
	}
	t.Skip("redistest: redis-sentinel not found on PATH; skipping (set " + requireEnv + "=1 to fail instead)")
}

// Sentinels are redis-sentinel processes that watch one primary, and its
// replicas, under one master name.
type Sentinels struct {
	t       testing.TB
	name    string
	servers []*Server
}

// StartSentinels starts n redis-sentinel processes (n ≥ 1), each on a free
// 127.0.0.1 port with its own configuration file in its own t.TempDir(),
// watching the primary at address primary under the master name name; a
// majority of them must agree that it is down to fail it over. They act
// fast: a primary is down after SentinelDownAfter without an answer, and
// the failover-timeout is 2s (so a second automatic failover of the same
// master can start 4s after the first). StartSentinels waits until
// every sentinel knows the primary's replicas (replicas of them) and the
// other sentinels, so that a failover can start at once. They are stopped
// by t.Cleanup.
func StartSentinels(t testing.TB, n int, name, primary string, replicas int) *Sentinels {
	t.Helper()
	RequireSentinel(t)
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		t.Fatalf("redistest: sentinels of %q: %v", primary, err)
		return nil
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s %[4]d\n"+
		"sentinel down-after-milliseconds %[1]s %[5]d\n"+
		"sentinel failover-timeout %[1]s %[6]d\n"+
		"sentinel parallel-syncs %[1]s %[7]d\n",
		name, host, port, n/2+1, SentinelDownAfter.Milliseconds(), sentinelFailoverTimeout.Milliseconds(), max(replicas, 1))
	s := &Sentinels{t: t, name: name}
	for range n {
		s.servers = append(s.servers, startProcess(t, false, conf, nil))
	}
	deadline := time.Now().Add(sentinelSettle)
	for _, sn := range s.servers {
		for {
			m, err := sentinelFields(sn, "MASTER", name)
			good := 0
			if err == nil {
				var rs []map[string]string
				rs, err = sentinelFields(sn, "REPLICAS", name)
				for _, r := range rs {
					// A replica Sentinel would promote: it has looked at
					// it (INFO), and its link to the primary is up.
					if r["flags"] == "slave" && r["master-link-status"] == "ok" {
						good++
					}
				}
			}
			if err == nil && good == replicas && len(m) == 1 && m[0]["num-other-sentinels"] == strconv.Itoa(n-1) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: sentinel %s does not know %d good replicas and %d other sentinels within %v: %v %v", sn.Addr(), replicas, n-1, sentinelSettle, m, err)
				return s
			}
			time.Sleep(pollInterval)
		}
	}
	return s
}

// Addrs returns the sentinels' addresses, for a client's list of sentinels.
func (s *Sentinels) Addrs() []string {
	addrs := make([]string, len(s.servers))
	for i, sn := range s.servers {
		addrs[i] = sn.Addr()
	}
	return addrs
}

// Servers returns the sentinel processes, to pause or kill one.
func (s *Sentinels) Servers() []*Server { return append([]*Server(nil), s.servers...) }

// Primary returns the address of the primary as the first sentinel that
// answers names it (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *Sentinels) Primary() (string, error) {
	var err error
	for _, sn := range s.servers {
		var reply string
		if reply, err = sn.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.name); err == nil {
			host, port, ok := strings.Cut(reply, "\n")
			if !ok {
				return "", fmt.Errorf("redistest: sentinel %s: no primary named %s: %q", sn.Addr(), s.name, reply)
			}
			return net.JoinHostPort(host, port), nil
		}
	}
	return "", fmt.Errorf("redistest: no sentinel answers: %w", err)
}

// Failover makes the first sentinel fail the primary over at once, with no
// agreement of the others (SENTINEL FAILOVER), as an operator would.
func (s *Sentinels) Failover() error {
	_, err := s.servers[0].Do("SENTINEL", "FAILOVER", s.name)
	return err
}

// WaitPrimary waits up to timeout until the sentinels name a primary other
// than old and that server says it is one (INFO replication: role:master),
// and returns its address.
func (s *Sentinels) WaitPrimary(old string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		addr, err := s.Primary()
		if err == nil && addr != old {
			info, ierr := do(addr, doTimeout, "INFO", "replication")
			if ierr == nil && strings.Contains(info, "role:master\r\n") {
				return addr, nil
			}
			err = ierr
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("redistest: no primary other than %s within %v (last: %q, %v)", old, timeout, addr, err)
		}
		time.Sleep(pollInterval)
	}
}

// sentinelFields returns the reply of SENTINEL <cmd> name on sn (MASTER:
// one set of fields; REPLICAS: one per replica) as maps of field to value.
// Do renders the reply's nested arrays as one line per element, so a new
// set begins at each "name" field.
func sentinelFields(sn *Server, cmd, name string) ([]map[string]string, error) {
	reply, err := sn.Do("SENTINEL", cmd, name)
	if err != nil || reply == "" {
		return nil, err
	}
	var sets []map[string]string
	lines := strings.Split(reply, "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		if lines[i] == "name" || len(sets) == 0 {
			sets = append(sets, map[string]string{})
		}
		sets[len(sets)-1][lines[i]] = lines[i+1]
	}
	return sets, nil
}
