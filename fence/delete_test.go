package fence_test

import (
	"context"
	"testing"

	"github.com/netlock-go/netlock/fence"
)

// TestDelete: a fenced delete removes the value and keeps the token, so a
// stale writer is refused after it as before.
func TestDelete(t *testing.T) {
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"delete", []step{{token: 3, value: "a"}, {del: true, token: 3}}},
		{"delete with a higher token", []step{{token: 3, value: "a"}, {del: true, token: 4}}},
		{"stale delete refused", []step{{token: 3, value: "a"}, {del: true, token: 2, stale: true}}},
		{"delete, then stale set refused", []step{{token: 3, value: "a"}, {del: true, token: 4}, {token: 3, value: "b", stale: true}}},
		{"delete, then set with the same token", []step{{token: 3, value: "a"}, {del: true, token: 4}, {token: 4, value: "b"}}},
		{"delete twice", []step{{token: 3, value: "a"}, {del: true, token: 4}, {del: true, token: 4}, {del: true, token: 3, stale: true}}},
		{"delete of no key records its token", []step{{del: true, token: 9}, {token: 8, value: "b", stale: true}, {token: 9, value: "c"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			forEachServer(t, func(t *testing.T, s server) { runSteps(t, s, "k", c.steps) })
		})
	}
}

// TestDeleteKeepsTTL: a key given a TTL by its user keeps it through a
// fenced delete; one without keeps none.
func TestDeleteKeepsTTL(t *testing.T) {
	forEachServer(t, func(t *testing.T, s server) {
		b := s.backend(t)
		ctx := context.Background()
		for _, key := range []string{"with", "without"} {
			if err := fence.Set(ctx, b, key, "a", 1); err != nil {
				t.Fatal(err)
			}
		}
		s.do(t, "PEXPIRE", "with", 60_000)
		for _, key := range []string{"with", "without"} {
			if err := fence.Delete(ctx, b, key, 2); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := s.dump(t, "with"), "hash map[t:2] ttl>0:true"; got != want {
			t.Errorf("with a TTL: got %s, want %s", got, want)
		}
		if got, want := s.dump(t, "without"), "hash map[t:2] ttl>0:false"; got != want {
			t.Errorf("without a TTL: got %s, want %s", got, want)
		}
	})
}
