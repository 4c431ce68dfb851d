package netlock

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// FuzzName checks that any byte string given to New as a lock name is either
// rejected with a clear error or mapped to keys (lock, release channel,
// waiters' queue, fence counter, tombstone) in one Redis Cluster slot, computed here by a
// reference implementation of Redis's HASH_SLOT independent of keySlot; and
// that two different names never share a key, but for the fence counter,
// which is per slot by design.
//
// Seeds are in testdata/fuzz/FuzzName; `go test -fuzz FuzzName` explores
// further.
func FuzzName(f *testing.F) {
	f.Add("orders:42", "orders:43")
	f.Add("a", "a}")
	f.Fuzz(func(t *testing.T, a, b string) {
		ma, erra := New(a, []Backend{&evalOnly{}})
		mb, errb := New(b, []Backend{&evalOnly{}})
		for _, c := range []struct {
			name string
			m    *NetMutex
			err  error
		}{{a, ma, erra}, {b, mb, errb}} {
			if c.err != nil {
				if c.m != nil || !strings.HasPrefix(c.err.Error(), "netlock: ") {
					t.Fatalf("New(%q): got %v, %v; want nil and an error starting \"netlock: \"", c.name, c.m, c.err)
				}
				if c.name != "" && c.name[0] != '}' {
					t.Fatalf("New(%q) rejected a usable name: %v", c.name, c.err)
				}
				continue
			}
			if c.m.Name() != c.name {
				t.Fatalf("Name(): got %q, want %q", c.m.Name(), c.name)
			}
			k := c.m.keys
			slot := refSlot(k.lock)
			for _, key := range []string{k.channel, k.waiters, k.fence, k.tomb(lockValue)} {
				if got := refSlot(key); got != slot {
					t.Fatalf("name %q: key %q in slot %d, lock key %q in slot %d", c.name, key, got, k.lock, slot)
				}
			}
			if !strings.Contains(k.lock, c.name) {
				t.Fatalf("name %q: lock key %q does not contain it", c.name, k.lock)
			}
		}
		if erra != nil || errb != nil || a == b {
			return
		}
		ka := []string{ma.keys.lock, ma.keys.channel, ma.keys.waiters, ma.keys.tomb(lockValue)}
		kb := []string{mb.keys.lock, mb.keys.channel, mb.keys.waiters, mb.keys.tomb(lockValue)}
		for _, x := range ka {
			for _, y := range kb {
				if x == y {
					t.Fatalf("names %q and %q share the key %q", a, b, x)
				}
			}
		}
	})
}

// lockValue is shaped like a lock value (rand.Text: 26 base32 characters).
const lockValue = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

// refSlot is Redis's HASH_SLOT (cluster.c, keyHashSlot), written
// independently of keySlot: CRC16 of the part between the first '{' and the
// first '}' after it when that part is not empty, else of the whole key.
func refSlot(key string) uint16 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16 // CRC-16/XMODEM, bit by bit
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// FuzzOptions checks that New, given any option values (each applied or
// not, as set says), either returns an error starting "netlock: " or a
// NetMutex whose resolved configuration is usable: a positive expiry of at
// least Redis's 1ms resolution, a node timeout below the validity left after
// the drift allowance, a drift factor in [0, 0.5), retry delays that the
// backoff turns into waits between them, a prefix without hash-tag braces,
// keys in one slot, and a holder identity (the prefix's string, set&128)
// of at most MaxHolderInfo printable bytes, written without a byte the
// scripts split on and read back as given.
//
// Seeds are in testdata/fuzz/FuzzOptions; `go test -fuzz FuzzOptions`
// explores further.
func FuzzOptions(f *testing.F) {
	f.Add(uint8(0), int64(0), 0.0, int64(0), int64(0), int64(0), "")
	f.Add(uint8(0xff), int64(time.Second), 0.01, int64(100*time.Millisecond), int64(time.Millisecond), int64(50*time.Millisecond), "app:")
	f.Add(uint8(0x80), int64(0), 0.0, int64(0), int64(0), int64(0), "web:1 +#%/x\n")
	f.Fuzz(func(t *testing.T, set uint8, expiry int64, drift float64, nodeTimeout, minRetry, maxRetry int64, prefix string) {
		var opts []Option
		if set&1 != 0 {
			opts = append(opts, WithExpiry(time.Duration(expiry)))
		}
		if set&2 != 0 {
			opts = append(opts, WithDriftFactor(drift))
		}
		if set&4 != 0 {
			opts = append(opts, WithNodeTimeout(time.Duration(nodeTimeout)))
		}
		if set&8 != 0 {
			opts = append(opts, WithRetryDelay(time.Duration(minRetry), time.Duration(maxRetry)))
		}
		if set&16 != 0 {
			opts = append(opts, WithPrefix(prefix))
		}
		if set&128 != 0 {
			opts = append(opts, WithHolderInfo(prefix))
		}
		opts = append(opts, WithAutoExtend(set&32 != 0), WithFencing(set&64 == 0))
		m, err := New("n", []Backend{&evalOnly{}}, opts...)
		if err != nil {
			if m != nil || !strings.HasPrefix(err.Error(), "netlock: ") {
				t.Fatalf("New: got %v, %v; want nil and an error starting \"netlock: \"", m, err)
			}
			return
		}
		c := m.cfg
		switch {
		case c.expiry < time.Millisecond:
			t.Fatalf("expiry %v accepted", c.expiry)
		case !(c.driftFactor >= 0 && c.driftFactor < 0.5):
			t.Fatalf("drift factor %v accepted", c.driftFactor)
		case c.nodeTimeout <= 0 || c.nodeTimeout >= c.expiry:
			t.Fatalf("node timeout %v accepted with expiry %v", c.nodeTimeout, c.expiry)
		case c.expiry-c.driftTerm() <= c.nodeTimeout:
			t.Fatalf("expiry %v leaves no validity after drift %v and node timeout %v", c.expiry, c.driftTerm(), c.nodeTimeout)
		case c.minRetryDelay <= 0 || c.maxRetryDelay < c.minRetryDelay:
			t.Fatalf("retry delays %v, %v accepted", c.minRetryDelay, c.maxRetryDelay)
		case strings.ContainsAny(c.prefix, "{}"):
			t.Fatalf("prefix %q accepted", c.prefix)
		case c.autoExtend != (set&32 != 0) || c.fencing != (set&64 == 0):
			t.Fatalf("auto-extend %v, fencing %v: not as set", c.autoExtend, c.fencing)
		case len(c.holderInfo) > MaxHolderInfo || !utf8.ValidString(c.holderInfo) || strings.ContainsFunc(c.holderInfo, func(r rune) bool { return !unicode.IsPrint(r) }):
			t.Fatalf("holder info %q accepted", c.holderInfo)
		case strings.ContainsAny(m.holder, ":+#"):
			t.Fatalf("holder info %q written as %q, with a byte the scripts split on", c.holderInfo, m.holder)
		case keyspace.HolderDecode(m.holder) != c.holderInfo:
			t.Fatalf("holder info %q written as %q, read back as %q", c.holderInfo, m.holder, keyspace.HolderDecode(m.holder))
		}
		if set&16 != 0 && !strings.HasPrefix(m.keys.lock, prefix+"{") {
			t.Fatalf("prefix %q: lock key %q", prefix, m.keys.lock)
		}
		if ms, err := strconv.ParseInt(m.expiryMS, 10, 64); err != nil || ms < 1 || ms != c.expiry.Milliseconds() {
			t.Fatalf("expiry %v sent to Redis as %q ms", c.expiry, m.expiryMS)
		}
		if ms, err := strconv.ParseInt(m.tombMS, 10, 64); err != nil || ms < 10 {
			t.Fatalf("tombstone TTL %q ms for expiry %v", m.tombMS, c.expiry)
		}
		if slot := refSlot(m.keys.lock); refSlot(m.keys.channel) != slot || (c.fencing && refSlot(m.keys.fence) != slot) {
			t.Fatalf("prefix %q: keys %+v not in one slot", c.prefix, m.keys)
		}
		// The waits of a LockCtx that keeps failing: between the minimum
		// and the maximum, however long it waits, or, when the holder's TTL
		// is shorter, just past it (by up to the minimum, as jitter).
		b := backoff{min: c.minRetryDelay, max: c.maxRetryDelay}
		for i := range 70 {
			busy := time.Duration(-1)
			if i%3 == 1 {
				busy = time.Duration(i) * time.Millisecond
			}
			d := b.next(busy)
			within := d >= c.minRetryDelay && d <= c.maxRetryDelay
			capped := busy >= 0 && d >= busy && d-busy <= c.minRetryDelay
			if !within && !capped {
				t.Fatalf("retry delays [%v, %v]: wait %d is %v (holder's TTL %v)", c.minRetryDelay, c.maxRetryDelay, i, d, busy)
			}
		}
		if math.IsNaN(c.driftFactor) {
			t.Fatal("NaN drift factor accepted")
		}
	})
}
