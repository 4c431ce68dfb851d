package netlock

import (
	"context"
	"strings"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// The key names and slots themselves are tested in internal/keyspace; these
// tests check what the NetMutex makes of them.

func TestFenceKeySharesTheLockSlot(t *testing.T) {
	for _, name := range []string{"a", "orders:42", "a}b", "{x}", "x{y", "ünïcode", strings.Repeat("z", 1000)} {
		k := newKeys("p:", name, true)
		if ls, fs := keySlot(k.lock), keySlot(k.fence); ls != fs {
			t.Errorf("name %q: lock key slot %d, fence key slot %d", name, ls, fs)
		}
		if cs := keySlot(k.channel); cs != keySlot(k.lock) {
			t.Errorf("name %q: channel slot %d, lock slot %d", name, cs, keySlot(k.lock))
		}
	}
	if k := newKeys("p:", "a", false); k.fence != "" {
		t.Errorf("fence key with fencing off: got %q, want none", k.fence)
	}
}

func TestTokensIncreaseAcrossNames(t *testing.T) {
	// Names in one slot share a counter; tokens stay increasing per name.
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		var last uint64
		for _, name := range []string{"a", "a", "b", "a"} {
			m := e.newMutex(t, name)
			mustLock(t, m)
			if tok := m.Token(); tok <= last && name == "a" {
				t.Errorf("token for %q: got %d after %d, want greater", name, tok, last)
			} else if name == "a" {
				last = tok
			}
			mustUnlock(t, m)
		}
		keys, _ := redis.Strings(e.do(t, "KEYS", "netlock:*"), nil)
		for _, k := range keys {
			if !strings.HasSuffix(k, ":fence") {
				t.Errorf("key left behind: %q", k)
			}
		}
	})
}

func TestFencingOff(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		m := e.newMutex(t, "nofence", WithFencing(false))
		if err := m.LockCtx(context.Background()); err != nil {
			t.Fatal(err)
		}
		if tok := m.Token(); tok != 0 {
			t.Errorf("Token with fencing off: got %d, want 0", tok)
		}
		mustUnlock(t, m)
		if keys, _ := redis.Strings(e.do(t, "KEYS", "*"), nil); len(keys) != 0 {
			t.Errorf("keys with fencing off after Unlock: got %v, want none", keys)
		}
	})
}
