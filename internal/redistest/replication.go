package redistest

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartReplica starts a redis-server, as Start does, that replicates the
// primary at address primary (a Server's Addr, or a Proxy's in front of
// one), and waits until its link to the primary is up, the first sync is
// done, and the primary counts it online. First it turns the primary's
// repl-diskless-sync off: a diskless sync waits for more replicas
// (repl-diskless-sync-delay, 5s), and after it the primary sends the replica
// nothing, nor does WAIT count it, until the replica's first
// acknowledgement, up to a second later; a sync through a file of the
// primary's (small) data set starts, and streams, at once.
func StartReplica(t testing.TB, primary string, args ...string) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		t.Fatalf("redistest: replica of %q: %v", primary, err)
		return nil
	}
	if _, err := do(primary, doTimeout, "CONFIG", "SET", "repl-diskless-sync", "no"); err != nil {
		t.Fatalf("redistest: primary %s: %v", primary, err)
		return nil
	}
	s := Start(t, args...)
	// REPLICAOF connects at once; --replicaof would wait for the server's
	// once-a-second cron.
	if _, err := s.Do("REPLICAOF", host, port); err != nil {
		t.Fatalf("redistest: replica %s: REPLICAOF %s: %v", s.addr, primary, err)
		return s
	}
	if err := s.WaitLinkUp(readyTimeout); err != nil {
		t.Fatalf("redistest: %v", err)
		return s
	}
	if err := waitOnline(primary, s.port, readyTimeout); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

// waitOnline waits up to timeout until the primary at address primary
// counts its replica listening on port as online (INFO replication). The
// replica's link is up a moment before: the primary takes the end of the
// sync's save into account at its next cron tick, and until then WAIT does
// not count the replica.
func waitOnline(primary string, port int, timeout time.Duration) error {
	want := ",port=" + strconv.Itoa(port) + ",state=online,"
	deadline := time.Now().Add(timeout)
	for {
		info, err := do(primary, doTimeout, "INFO", "replication")
		if err == nil && strings.Contains(info, want) {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("INFO replication:\n%s", info)
			}
			return fmt.Errorf("primary %s: replica on port %d not online within %v: %w", primary, port, timeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// WaitLinkUp waits up to timeout until s is a replica whose link to its
// primary is up (INFO replication says master_link_status:up): the first
// sync is done, and writes to the primary now reach s.
func (s *Server) WaitLinkUp(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		info, err := s.Do("INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up\r\n") {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("INFO replication:\n%s", info)
			}
			return fmt.Errorf("replica %s: link to its primary not up within %v: %w", s.addr, timeout, err)
		}
		time.Sleep(pollInterval)
	}
}
