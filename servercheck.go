package netlock

import (
	"context"
	"log/slog"
	"strings"
)

// checkServers looks, before m's first acquire, at the settings of m's
// servers that break the lock, and logs each at Warn: today a
// maxmemory-policy that evicts keys with a TTL (volatile-*, allkeys-*),
// which can take a lock key from under its holder, and, for allkeys-*, the
// fence counters. It asks with the inspect script (INFO, which managed
// services allow where they refuse CONFIG).
//
// Each server is looked at once per Backend that has a Hub (a Subscriber:
// every Backend netlock provides), once per NetMutex otherwise, and only
// once per NetMutex whatever the answer: a node that does not answer is
// not asked again by this NetMutex, and the acquire that follows reports
// it.
func (m *engine) checkServers(ctx context.Context) {
	if m.checked.Load() || !m.checked.CompareAndSwap(false, true) {
		return
	}
	if m.log(ctx, slog.LevelWarn) == nil {
		return
	}
	targets := make([]bool, len(m.nodes))
	any := false
	for i := range m.nodes {
		h := m.hubs[i]
		targets[i] = h == nil || h.checked.CompareAndSwap(false, true)
		any = any || targets[i]
	}
	if !any {
		return
	}
	keys := []string{m.keys.lock, m.keys.waiters, m.keys.fence}
	if m.keys.fence == "" {
		keys = keys[:2]
	}
	replies := m.fanout(ctx, inspectScript, keys, []string{strings.Join(maxmemoryPolicies, ",")}, targets)
	for i, r := range replies {
		if !targets[i] {
			continue
		}
		n := nodeInfo(i, r)
		if n.Err != nil {
			if h := m.hubs[i]; h != nil {
				h.checked.Store(false) // another NetMutex of this Backend asks again
			}
			continue
		}
		if n.Evicts() {
			m.evictionWarning(ctx, i, n)
		}
	}
}

func (m *engine) evictionWarning(ctx context.Context, node int, n NodeInfo) {
	what := "lock keys, which releases a lock under its holder"
	if strings.HasPrefix(n.MaxMemoryPolicy, "allkeys-") {
		what += ", and fence counters, which makes fencing tokens go back"
	}
	when := "once maxmemory is set (it is not now)"
	if n.MaxMemory > 0 {
		when = "whenever its memory reaches maxmemory"
	}
	if l := m.log(ctx, slog.LevelWarn); l != nil {
		l.LogAttrs(ctx, slog.LevelWarn, "netlock: the server's maxmemory-policy "+n.MaxMemoryPolicy+" can evict "+what+", "+when+"; netlock needs maxmemory-policy noeviction",
			m.lockAttr(), slog.Int("node", node), slog.String("maxmemory_policy", n.MaxMemoryPolicy), slog.Int64("maxmemory", n.MaxMemory))
	}
}
