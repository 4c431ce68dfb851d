package netlock

import (
	"log/slog"
	"strings"
	"testing"
)

// A server whose maxmemory-policy can evict lock keys is named at Warn by
// the first acquire of a Backend, once; noeviction says nothing.
func TestEvictionPolicyWarned(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		cases := []struct {
			policy, maxmemory string
			want              []string // in the message; nil: no warning
		}{
			{"noeviction", "0", nil},
			{"volatile-lru", "0", []string{"volatile-lru", "lock keys", "once maxmemory is set"}},
			{"allkeys-lru", "100mb", []string{"allkeys-lru", "fence counters", "whenever its memory reaches maxmemory"}},
		}
		for _, c := range cases {
			t.Run(c.policy, func(t *testing.T) {
				e.do(t, "CONFIG", "SET", "maxmemory-policy", c.policy)
				e.do(t, "CONFIG", "SET", "maxmemory", c.maxmemory)
				t.Cleanup(func() {
					e.do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
					e.do(t, "CONFIG", "SET", "maxmemory", "0")
				})
				logs := &logRecords{level: slog.LevelWarn}
				b := e.backend(t)
				for _, name := range []string{"first", "second"} { // two NetMutexes, one Backend
					m, err := New(name, []Backend{b}, WithLogger(slog.New(logs)))
					if err != nil {
						t.Fatal(err)
					}
					mustLock(t, m)
					mustUnlock(t, m)
				}
				recs := logs.find(slog.LevelWarn, "maxmemory-policy")
				if c.want == nil {
					if len(recs) != 0 {
						t.Errorf("warnings with %s: got %+v, want none", c.policy, recs)
					}
					return
				}
				if len(recs) != 1 {
					t.Fatalf("warnings with %s, two NetMutexes on one Backend: got %d, want 1: %+v", c.policy, len(recs), recs)
				}
				for _, w := range c.want {
					if !strings.Contains(recs[0].msg, w) {
						t.Errorf("warning %q does not say %q", recs[0].msg, w)
					}
				}
				if recs[0].attrs["lock"] != "first" || recs[0].attrs["node"] != "0" || recs[0].attrs["maxmemory_policy"] != c.policy {
					t.Errorf("warning's attributes: got %v, want lock=first node=0 maxmemory_policy=%s", recs[0].attrs, c.policy)
				}
			})
		}
	})
}
