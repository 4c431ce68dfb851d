package keyspace

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSlot(t *testing.T) {
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
		if got := Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q): got %d, want %d", tt.key, got, tt.want)
		}
	}
}

func TestSlotTagsCoverEverySlot(t *testing.T) {
	for slot, tag := range SlotTags() {
		if tag == "" || len(tag) > 3 || strings.ContainsAny(tag, "{}") {
			t.Fatalf("slot %d: tag %q, want 1 to 3 characters without braces", slot, tag)
		}
		if got := Slot("netlock:{" + tag + "}:fence"); got != uint16(slot) {
			t.Fatalf("fence key for slot %d hashes to %d", slot, got)
		}
	}
}

func TestNew(t *testing.T) {
	k := New("netlock:", "orders:42", true)
	if k.Lock != "netlock:{orders:42}" || k.Channel != "netlock:{orders:42}:released" {
		t.Errorf("New: got lock %q, channel %q; want netlock:{orders:42} and netlock:{orders:42}:released", k.Lock, k.Channel)
	}
	if !strings.HasPrefix(k.Fence, "netlock:{") || !strings.HasSuffix(k.Fence, "}:fence") {
		t.Errorf("New: fence key %q, want netlock:{<tag>}:fence", k.Fence)
	}
	if got, want := Tomb(k.Lock, "v"), "netlock:{orders:42}:gone:v"; got != want {
		t.Errorf("Tomb: got %q, want %q", got, want)
	}
	if k := New("p:", "a", false); k.Fence != "" {
		t.Errorf("fence key with fencing off: got %q, want none", k.Fence)
	}
}

func TestKeysShareTheLockSlot(t *testing.T) {
	for _, name := range []string{"a", "orders:42", "a}b", "{x}", "x{y", "ünïcode", strings.Repeat("z", 1000)} {
		k := New("p:", name, true)
		ls := Slot(k.Lock)
		for _, other := range []string{k.Fence, k.Channel, Tomb(k.Lock, "value")} {
			if s := Slot(other); s != ls {
				t.Errorf("name %q: %q in slot %d, lock key %q in slot %d", name, other, s, k.Lock, ls)
			}
		}
	}
}

// TestRWSameSlot: every key and channel of a NetRWMutex is in the slot of
// its writer key, so one script may touch them all on a Redis Cluster.
func TestRWSameSlot(t *testing.T) {
	for _, name := range []string{"a", "job", "quiz:42", "{x}", "名前"} {
		k := RW("netlock:", name, true)
		want := Slot(k.Writer)
		for _, key := range []string{k.Writers, k.Readers, k.Leases, k.Channel, k.Joined, k.Fence, Tomb(k.Writer, "v")} {
			if got := Slot(key); got != want {
				t.Errorf("name %q: %s in slot %d, writer key %s in %d", name, key, got, k.Writer, want)
			}
		}
		if k.Writer == New("netlock:", name, true).Lock {
			t.Errorf("name %q: the NetRWMutex's writer key is the NetMutex's lock key", name)
		}
	}
}

// TestOnceSameSlot: every key and channel of a Once is in the slot of its
// lock key, which is not a NetMutex's, so one script may touch them all on
// a Redis Cluster.
func TestOnceSameSlot(t *testing.T) {
	for _, name := range []string{"a", "migrate:v42", "{x}", "a}b", "名前"} {
		k := Once("netlock:", name, true)
		if got, want := k.Lock, "netlock:{"+name+"}:once"; got != want {
			t.Errorf("name %q: lock key %q, want %q", name, got, want)
		}
		want := Slot(k.Lock)
		for _, key := range []string{k.Done, k.Waiters, k.Channel, k.Fence, Tomb(k.Lock, "v")} {
			if got := Slot(key); got != want {
				t.Errorf("name %q: %s in slot %d, lock key %s in %d", name, key, got, k.Lock, want)
			}
		}
		if k.Lock == New("netlock:", name, true).Lock {
			t.Errorf("name %q: the Once's lock key is the NetMutex's", name)
		}
	}
	if k := Once("p:", "a", false); k.Fence != "" {
		t.Errorf("fence key with fencing off: got %q, want none", k.Fence)
	}
}
