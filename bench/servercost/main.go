// servercost measures the server time of a lock+unlock cycle, serially, on an
// idle Redis: netlock's NetMutex against the hand-written floor (SET NX PX
// + EVALSHA compare-and-delete) and two EVALSHAs of `return 1`.
//
// Usage (from bench/, against a redis-server you started on ADDR):
//
//	go run ./servercost ADDR N [ROUNDS]
//
// Redis 7 counts the commands a script runs in INFO commandstats too, and
// includes their time in the script's usec: summing every line counts them
// twice. The honest server time of a cycle is the usec of the commands the
// client sent (top-level) only: evalsha (and eval, fcall) for netlock; set +
// evalsha for the hand-written cycle. The "top" column is that; "all" is
// the double-counting sum, kept for comparison; "inner" lists the commands
// run inside scripts, calls per cycle. The "floor" rows are scripts of
// netlock's shape doing only what its common paths must (see floorAcq).
package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"
	"github.com/netlock-go/netlock"
)

type stat struct{ calls, usec float64 }

func stats(c redis.Conn) map[string]stat {
	per := map[string]stat{}
	info, _ := redis.String(c.Do("INFO", "commandstats"))
	for _, l := range strings.Split(info, "\r\n") {
		if !strings.HasPrefix(l, "cmdstat_") {
			continue
		}
		name, rest, _ := strings.Cut(strings.TrimPrefix(l, "cmdstat_"), ":")
		var s stat
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				s.calls = x
			case "usec":
				s.usec = x
			}
		}
		if name == "info" || name == "config|resetstat" || name == "config" {
			continue
		}
		per[name] = s
	}
	return per
}

// scriptCmds are the top-level commands that run a script.
var scriptCmds = map[string]bool{"evalsha": true, "eval": true, "evalsha_ro": true, "eval_ro": true, "fcall": true, "fcall_ro": true}

const (
	floorAcquire = `redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3])
local t = redis.call('INCR', KEYS[4])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%d', t) .. ARGV[3], 'PX', ARGV[2])`
	floorRelease = `redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])`
)

func main() {
	addr := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	rounds := 3
	if len(os.Args) > 3 {
		rounds, _ = strconv.Atoi(os.Args[3])
	}
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }, MaxIdle: 4}
	c, err := redis.Dial("tcp", addr)
	if err != nil {
		panic(err)
	}
	// report prints the cycle's top-level µs (the script commands, plus
	// the commands named in sent, which the client sends itself), the
	// double-counting sum, and the commands run inside scripts, and
	// returns the top-level µs.
	report := func(label string, sent ...string) float64 {
		per := stats(c)
		var top, all float64
		var inner []string
		for name, s := range per {
			all += s.usec
			isSent := scriptCmds[name]
			for _, x := range sent {
				isSent = isSent || name == x
			}
			if isSent {
				top += s.usec
				continue
			}
			inner = append(inner, fmt.Sprintf("%s %.2f", name, s.calls/float64(n)))
		}
		// A command the client sends and scripts run too (set, for the
		// hand-written cycle) is counted whole in top: none of the
		// hand-written script's calls is a SET.
		sort.Strings(inner)
		fmt.Printf("%-22s top %6.2f µs/op  all %6.2f µs/op  inner/op: %s\n", label, top/float64(n), all/float64(n), strings.Join(inner, ", "))
		c.Do("CONFIG", "RESETSTAT")
		return top / float64(n)
	}
	del := redis.NewScript(1, `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	empty := redis.NewScript(1, `return 1`)
	del.Load(c)
	empty.Load(c)
	mutexes := map[bool]*netlock.NetMutex{}
	for _, fence := range []bool{true, false} {
		opts := []netlock.Option{}
		if !fence {
			opts = append(opts, netlock.WithFencing(false))
		}
		m, err := netlock.New("cost"+strconv.FormatBool(fence), []netlock.Backend{netlock.NewRedigo(pool)}, opts...)
		if err != nil {
			panic(err)
		}
		m.Lock() // loads the scripts
		m.Unlock()
		mutexes[fence] = m
	}
	// The floor of netlock's shape: two EVALSHAs with the keys and
	// arguments a fenced NetMutex sends (a fresh value per cycle), replying
	// with its arrays; with no call, then with the five calls its common
	// paths make (EXISTS, INCR, SET; GET, DEL) and no other work, then the
	// same replying with an integer. What netlock spends above "calls" is
	// its scripts' own work.
	floorAcq := map[string]*redis.Script{
		"no calls":               redis.NewScript(4, `return {1, 1, 0}`),
		"calls":                  redis.NewScript(4, floorAcquire+` return {1, t, 0}`),
		"calls, integer replies": redis.NewScript(4, floorAcquire+` return t`),
	}
	floorRel := map[string]*redis.Script{
		"no calls":               redis.NewScript(4, `return {1, 0, 0, 0}`),
		"calls":                  redis.NewScript(4, floorRelease+` return {1, 0, 0, 0}`),
		"calls, integer replies": redis.NewScript(4, floorRelease+` return 1`),
	}
	floorKeys := func(v string) []any {
		return []any{"netlock:{floor}", "netlock:{floor}:gone:" + v, "netlock:{floor}:waiters", "netlock:{7m}:fence"}
	}
	for round := 0; round < rounds; round++ {
		c.Do("CONFIG", "RESETSTAT")
		for i := 0; i < n; i++ {
			c.Do("SET", "hw", "v", "NX", "PX", 10000)
			del.Do(c, "hw", "v")
		}
		hw := report("hand-written", "set")
		for i := 0; i < n; i++ {
			empty.Do(c, "e", "v")
			empty.Do(c, "e", "v")
		}
		report("2x empty evalsha")
		for _, fence := range []bool{true, false} {
			m := mutexes[fence]
			c.Do("CONFIG", "RESETSTAT")
			for i := 0; i < n; i++ {
				m.Lock()
				m.Unlock()
			}
			nl := report(fmt.Sprintf("netlock fence=%v", fence))
			fmt.Printf("%-22s ratio to hand-written %.2f\n", "", nl/hw)
		}
		for _, name := range []string{"no calls", "calls", "calls, integer replies"} {
			a, r := floorAcq[name], floorRel[name]
			c.Do("CONFIG", "RESETSTAT")
			for i := 0; i < n; i++ {
				v := fmt.Sprintf("%026d", i)
				a.Do(c, append(floorKeys(v), v, "8000", ":vm/1")...)
				r.Do(c, append(floorKeys(v), v, "80000", "8")...)
			}
			f := report("floor: " + name)
			fmt.Printf("%-22s ratio to hand-written %.2f\n", "", f/hw)
		}
	}
}
