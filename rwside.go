package netlock

import (
	"strconv"
	"strings"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// placeExpiries: a waiter of a NetRWMutex keeps its place in Redis for
// three expiries after the attempt that last renewed it (an attempt renews
// a place with less than half of that left; a waiter attempts at least
// every expiry): a waiter whose process died keeps others out for at most
// that long.
const placeExpiries = 3

// rwKeys are the Redis keys of a NetRWMutex (see lua/rw_acquire.lua).
type rwKeys = keyspace.RWKeys

// rwSide is the kind of a NetRWMutex's read lease (mode 'r') or write lock
// ('w'): lua/rw_acquire.lua, rw_release.lua, rw_extend.lua, rw_leave.lua,
// whose argument starts with the mode.
type rwSide struct {
	m       *engine
	mode    byte
	keys    rwKeys
	placeMS string // how long a waiter's place lasts: placeExpiries
}

func (s *rwSide) observed() Kind {
	if s.mode == 'r' {
		return KindRead
	}
	return KindWrite
}

func (s *rwSide) acquireCall(value, tomb, proposal string, q ask) (*Script, []string, []string) {
	k := s.keys
	keys := []string{k.Writer, tomb, k.Writers, k.Readers, k.Leases}
	if s.mode == 'w' && k.Fence != "" {
		keys = append(keys, k.Fence)
	}
	flags := ""
	if strings.Contains(q.flags, "q") {
		flags = "q"
	}
	return rwAcquireScript, keys, []string{string(s.mode) + ":" + value + ":" + s.m.expiryMS + ":" + proposal + ":" + q.member + ":" + flags + ":" + s.placeMS + ":" + strconv.FormatInt(q.arrival, 10) + ":" + s.m.holder}
}

// acquireReply reads rw_acquire.lua's reply: acquire.lua's, except that a
// reader's third integer says whether a writer waits, and a fourth that a
// release granted its lease.
func (s *rwSide) acquireReply(vals []int64) acquireReply {
	r := readAcquire(vals)
	if s.mode == 'r' && r.status == acquireHeld {
		r.granted, r.writerWaits = 0, vals[2] == 1
		if len(vals) > 3 {
			r.granted = vals[3]
		}
	}
	return r
}

func (s *rwSide) releaseCall(value, tomb string) (*Script, []string, []string) {
	k := s.keys
	keys := []string{k.Writer, tomb, k.Writers, k.Readers, k.Leases}
	if k.Fence != "" {
		keys = append(keys, k.Fence) // a writer granted the lock takes its token
	}
	return rwReleaseScript, keys, []string{string(s.mode) + ":" + value + ":" + s.m.tombMS}
}

func (s *rwSide) extendCall(value string) (*Script, []string, []string) {
	k := s.keys
	return rwExtendScript, []string{k.Writer, k.Leases, k.Writers}, []string{string(s.mode) + ":" + value + ":" + s.m.expiryMS}
}

func (s *rwSide) keepCall(value string, ms int64) (*Script, []string, []string) {
	k := s.keys
	return rwExtendScript, []string{k.Writer, k.Leases, k.Writers}, []string{string(s.mode) + ":" + value + ":" + strconv.FormatInt(ms, 10)}
}

// extended: what the nodes say now of a read lease: a writer that gave up
// no longer keeps this process's readers out.
func (s *rwSide) extended(h *hold, replies []nodeReply) {
	if s.mode == 'r' {
		h.writerWaits.Store(writerWaits(replies))
	}
}

func (s *rwSide) leaveCall(member string) (*Script, []string, []string) {
	k := s.keys
	keys := []string{k.Writers, k.Readers, k.Leases, k.Writer, k.Fence}
	if k.Fence == "" {
		keys = keys[:4]
	}
	return rwLeaveScript, keys, []string{member}
}

// waitFlags: a NetRWMutex's waiter always takes its place, even when it
// polls: the place is what keeps later readers (or writers) out.
func (s *rwSide) waitFlags(_, _, queued bool) string {
	if queued {
		return "jq"
	}
	return "j"
}

func (*rwSide) orderedByArrival() {}

// messageGrant: a read lease has no token; the message's last number says
// whether a writer waits (see lua/rw_wake.lua).
func (s *rwSide) messageGrant(g *grant) {
	if s.mode == 'r' {
		g.token, g.writerWaits = 0, g.token == 1
	}
}

func (*rwSide) rule() localRule { return rwRule{} }

// rwRule is a NetRWMutex's local admission rule, sync.RWMutex's among the
// goroutines of its process under its write lock: a hold given back goes
// to the first in line, a writer alone or a reader with every reader
// waiting next to it (see enterShared); the readers waiting when a writer
// leaves all get in before a later writer.
type rwRule struct{ exclusiveRule }

func (rwRule) admitLocked(m *engine, h *hold, n int64) (rest int64, handed int) {
	rest, handed = exclusiveRule{}.admitLocked(m, h, n)
	if handed > 0 && m.shared > 0 { // a reader got it: the readers next to it too
		handed += m.admitSharedLocked(h)
	}
	return rest, handed
}

// writerWaits reports whether a node's reply to a read lease's extend says
// that a writer waits (see lua/rw_extend.lua).
func writerWaits(replies []nodeReply) bool {
	for _, r := range replies {
		if r.err == nil && r.vals[0] == releaseDone && len(r.vals) > 1 && r.vals[1] == 1 {
			return true
		}
	}
	return false
}
