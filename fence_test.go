package netlock

import (
	"context"
	"strings"
	"testing"

	"github.com/gomodule/redigo/redis"
)

func TestKeySlot(t *testing.T) {
	// Values from Redis's CLUSTER KEYSLOT.
	tests := []struct {
		key  string
		want uint16
	}{
		{"foo", 12182},
		{"123456789", 12739},
		{"{user1000}.following", 3443},
		{"foo{}{bar}", 8363}, // empty tag: the whole key
		{"foo{{bar}}zap", 4015},
		{"foo{bar}{zap}", 5061},
	}
	for _, tt := range tests {
		if got := keySlot(tt.key); got != tt.want {
			t.Errorf("keySlot(%q): got %d, want %d", tt.key, got, tt.want)
		}
	}
}

func TestSlotTagsCoverEverySlot(t *testing.T) {
	for slot, tag := range slotTags() {
		if tag == "" || len(tag) > 3 || strings.ContainsAny(tag, "{}") {
			t.Fatalf("slot %d: tag %q, want 1 to 3 characters without braces", slot, tag)
		}
		if got := keySlot("netlock:{" + tag + "}:fence"); got != uint16(slot) {
			t.Fatalf("fence key for slot %d hashes to %d", slot, got)
		}
	}
}

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
