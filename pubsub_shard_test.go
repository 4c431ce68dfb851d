package netlock

import (
	"context"
	"sync"
	"testing"
	"time"
)

// A sharded Hub keeps one link per node that Shard names, and a link that
// fails wakes the waiters of its channels only: the other links, and their
// watches, stay. A message from a failed link is not dispatched, even for a
// channel subscribed again elsewhere.
func TestHubShardLinks(t *testing.T) {
	shards := map[string]string{"a": "n1", "a2": "n1", "b": "n2"}
	var mu sync.Mutex
	listeners := map[string][]*shardListener{}
	h := NewHub(HubConfig{
		Shard: func(_ context.Context, channel string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return shards[channel], nil
		},
		ListenShard: func(_ context.Context, node string, onMessage func(channel, payload string)) (Listener, error) {
			l := &shardListener{node: node, onMessage: onMessage, confirms: make(chan string, 8), failed: make(chan struct{})}
			mu.Lock()
			listeners[node] = append(listeners[node], l)
			mu.Unlock()
			return l, nil
		},
	})
	if !h.sharded() || !h.counted {
		t.Fatalf("sharded %v, counted %v; want a sharded Hub that counts", h.sharded(), h.counted)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wakes := map[string]chan string{}
	watches := map[string]*watch{}
	for _, ch := range []string{"a", "a2", "b"} {
		wakes[ch] = make(chan string, 1)
		w, err := h.watch(ctx, ch, wakes[ch])
		if err != nil {
			t.Fatalf("watch %s: %v", ch, err)
		}
		watches[ch] = w
	}
	h.mu.Lock()
	if len(h.links) != 2 || h.links["n1"] == nil || h.links["n2"] == nil {
		t.Errorf("links: got %v, want n1 and n2", h.links)
	}
	h.mu.Unlock()
	if n := len(listeners["n1"]) + len(listeners["n2"]); n != 2 {
		t.Errorf("connections opened: got %d, want 2", n)
	}

	old := listeners["n1"][0]
	old.fail()
	eventually(t, 5*time.Second, "n1's watches dead", func() bool { return watches["a"].dead() && watches["a2"].dead() })
	for _, ch := range []string{"a", "a2"} {
		// The watches are dead (the link's down channel closed) before
		// their waiters are woken: wait for the wake-up.
		select {
		case p := <-wakes[ch]:
			if p != "" {
				t.Errorf("%s woken with %q, want \"\" (connection failed)", ch, p)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s not woken by its link's failure", ch)
		}
	}
	if watches["b"].dead() {
		t.Error("n2's watch died with n1's link")
	}
	select {
	case p := <-wakes["b"]:
		t.Errorf("b woken with %q by n1's failure", p)
	default:
	}

	// The slot of a moved to n2: watched again there, on n2's link.
	mu.Lock()
	shards["a"] = "n2"
	mu.Unlock()
	w, err := h.watch(ctx, "a", wakes["a"])
	if err != nil {
		t.Fatalf("watch a again: %v", err)
	}
	if w.topic.link.node != "n2" || len(listeners["n2"]) != 1 {
		t.Errorf("a watched again on %s with %d n2 connections; want n2's one link", w.topic.link.node, len(listeners["n2"]))
	}
	old.onMessage("a", "late") // from the failed link: not a's link any more
	listeners["n2"][0].onMessage("a", "now")
	if p := <-wakes["a"]; p != "now" {
		t.Errorf("a woken with %q, want the message of its own link", p)
	}
	w.stop()
	watches["b"].stop()
	for _, ch := range []string{"a", "a2"} {
		watches[ch].stop()
	}
	eventually(t, 5*time.Second, "every link closed once idle", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.links) == 0
	})
}

// New names what a Hub lacks to open a connection.
func TestNewIncompleteHub(t *testing.T) {
	shard := func(context.Context, string) (string, error) { return "", nil }
	for _, c := range []struct {
		cfg  HubConfig
		want string
	}{
		{HubConfig{}, "netlock: backend 0: its Hub has no Listen function (HubConfig.Listen)"},
		{HubConfig{Cluster: true}, "netlock: backend 0: its Hub has no Listen function (HubConfig.Listen)"},
		{HubConfig{Shard: shard}, "netlock: backend 0: its Hub has a Shard function but no ListenShard (HubConfig.ListenShard)"},
	} {
		_, err := New("x", []Backend{hubBackend{hub: NewHub(c.cfg)}})
		if err == nil || err.Error() != c.want {
			t.Errorf("New with %+v: got %v, want %q", c.cfg, err, c.want)
		}
	}
}
