package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/keyspace"
)

// semCountScript reads, in one step, what Redis counts as out for the
// chaos semaphore: the counts and pending grants of the leases whose
// deadlines have not passed (lua/sem_wake.lua's used, without purging),
// and the whole state when that exceeds the size.
var semCountScript = redis.NewScript(2, `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local z = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local n = 0
for i = 1, #z, 2 do
  if tonumber(z[i + 1]) > now then
    n = n + tonumber(redis.call('HGET', KEYS[2], z[i]) or '0')
    local g = redis.call('HGET', KEYS[2], z[i] .. '#g')
    if g then
      n = n + tonumber(string.match(g, ':(%d+)$'))
    end
  end
end
if n <= tonumber(ARGV[1]) then
  return {n}
end
local dump = {'now ' .. now}
for i = 1, #z, 2 do
  dump[#dump + 1] = z[i] .. '@' .. z[i + 1]
end
local p = redis.call('HGETALL', KEYS[2])
for i = 1, #p, 2 do
  dump[#dump + 1] = p[i] .. '=' .. p[i + 1]
end
return {n, table.concat(dump, ' ')}
`)

// semCounter watches, from a connection of its own (not through the
// clients' proxies), how many permits Redis counts as out, every
// millisecond or so, until ctx ends. The Semaphore's scripts keep that
// count at most the size after every call; a count above it is a grant
// the scripts should not have made, whatever the clients' clocks say (the
// history's check of valid holds sees the clients' side). The server may
// be paused or restarted under it: calls that fail are skipped.
type semCounter struct {
	start  time.Time // of the run, for the times reported
	mu     sync.Mutex
	over   []string    // the first overs seen, with Redis's state
	at     []time.Time // when each was seen
	checks int
	max    int64
}

func (c *semCounter) run(ctx context.Context, addr string, size int64) {
	k := keyspace.Sem(netlock.DefaultPrefix, semName)
	var conn redis.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			conn, err = redis.Dial("tcp", addr, redis.DialConnectTimeout(50*time.Millisecond),
				redis.DialReadTimeout(200*time.Millisecond), redis.DialWriteTimeout(200*time.Millisecond))
			if err != nil {
				conn = nil
				time.Sleep(10 * time.Millisecond)
				continue
			}
		}
		vals, err := redis.Values(semCountScript.Do(conn, k.Leases, k.Permits, size))
		if err != nil {
			conn.Close()
			conn = nil
			continue
		}
		n, _ := redis.Int64(vals[0], nil)
		c.mu.Lock()
		c.checks++
		c.max = max(c.max, n)
		if len(vals) > 1 && len(c.over) < 10 {
			dump, _ := redis.String(vals[1], nil)
			now := time.Now()
			c.over = append(c.over, fmt.Sprintf("Redis counts %d permits out, size %d, at %v: %s", n, size, now.Sub(c.start).Round(time.Microsecond), dump))
			c.at = append(c.at, now)
		}
		c.mu.Unlock()
		time.Sleep(500 * time.Microsecond)
	}
}

// report returns the overs seen, and a line of figures.
func (c *semCounter) report() (violations []string, figures string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.over, fmt.Sprintf("Redis's count of permits out checked %d times, at most %d", c.checks, c.max)
}

// logCalls logs every client's script calls that overlap the 300ms before
// each over seen.
func (c *semCounter) logCalls(t interface{ Logf(string, ...any) }, recs []*semRecorder) {
	c.mu.Lock()
	at := slices.Clone(c.at)
	c.mu.Unlock()
	for i, tm := range at {
		from := tm.Add(-300 * time.Millisecond)
		t.Logf("calls around Redis's over %d:", i)
		for _, r := range recs {
			r.mu.Lock()
			for _, call := range r.calls {
				if !call.end.Before(from) && !call.start.After(tm) {
					t.Logf("  client %d: %s %v-%v %s: %v %v", r.client, call.script, call.start.Sub(c.start).Round(time.Microsecond),
						call.end.Sub(c.start).Round(time.Microsecond), call.arg, call.vals, call.err)
				}
			}
			r.mu.Unlock()
		}
	}
}

// TestSemCounterBites: the counter reports a state of more permits out
// than the size (two live leases of 2 and a pending grant of 1, size 3),
// and not one of as many as the size (an expired lease left out).
func TestSemCounterBites(t *testing.T) {
	s := startServers(t, 1)[0]
	k := keyspace.Sem(netlock.DefaultPrefix, semName)
	count := func() *semCounter {
		c := &semCounter{start: time.Now()}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		c.run(ctx, s.Addr(), 3)
		return c
	}
	far := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	for _, cmd := range [][]string{
		{"ZADD", k.Leases, far, "A", far, "B", "1", "C"},
		{"HSET", k.Permits, "A", "2", "B", "1", "C", "2", "#size", "3"},
	} {
		if _, err := s.Do(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	if over, fig := count().report(); len(over) != 0 {
		t.Fatalf("3 of 3 out (and an expired lease of 2): %q (%s), want none", over, fig)
	}
	if _, err := s.Do("HSET", k.Permits, "B#g", "N:1"); err != nil {
		t.Fatal(err)
	}
	over, fig := count().report()
	if len(over) == 0 || !strings.Contains(over[0], "Redis counts 4 permits out, size 3") || !strings.Contains(over[0], "B#g=N:1") {
		t.Fatalf("4 of 3 out: %q (%s), want it reported with the state", over, fig)
	}
}
