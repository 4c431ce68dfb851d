package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// Exit codes of "netlock status".
const (
	exitFree = 0
	exitHeld = 1
)

const statusHelp = `Usage: netlock status [flags] NAME

Shows whether the lock NAME is held, on each Redis node: the remaining TTL
of its key, the holder's fencing token, and the node's fence counter (the
highest token it has granted in the key's hash slot).

The lock is held when a majority of the nodes (one of one) hold its key with
one holder's value; a key on fewer nodes is left over from an acquire that
failed or a hold that expired elsewhere, and no longer excludes anyone.

Exit status: 0 free, 1 held, 2 bad usage or too few nodes answered to tell.

` + connHelp + `
Flags:
`

// statusTimeout bounds each node's answer, dialling included.
const statusTimeout = 2 * time.Second

// runStatus runs "netlock status" with args (the arguments after "status")
// and returns the exit code.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("netlock status", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cf connFlags
	cf.register(fs)
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "netlock status: "+format+"\n", a...)
		fmt.Fprintln(stderr, `Run "netlock status --help" for usage.`)
		return exitUsage
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, statusHelp)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return exitOK
		}
		return bad("%v", err)
	}
	switch {
	case fs.NArg() == 0:
		return bad("missing the lock name: netlock status [flags] NAME")
	case fs.NArg() > 1:
		return bad("unexpected %q after the lock name: flags go before NAME", fs.Arg(1))
	case fs.Arg(0) == "":
		return bad("empty lock name")
	}
	c, err := cf.resolve(os.Getenv)
	if err != nil {
		return bad("%v", err)
	}
	name := fs.Arg(0)
	keys := keyspace.New(c.prefix, name, true)

	pools := c.pools()
	defer closePools(pools)
	states := make([]nodeState, len(pools))
	var wg sync.WaitGroup
	for i, p := range pools {
		wg.Go(func() { states[i] = readNode(ctx, p, keys) })
	}
	wg.Wait()

	code, summary := judge(states)
	fmt.Fprintf(stdout, "lock %q: %s\n", name, summary)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tTTL\tTOKEN\tFENCE COUNTER")
	for i, s := range states {
		fmt.Fprintf(tw, "%s\t%s\n", c.addrs[i], s)
	}
	tw.Flush()
	for i, s := range states {
		if s.err != nil {
			fmt.Fprintf(stderr, "netlock status: %s: %s\n", c.addrs[i], oneLine(s.err))
		}
	}
	return code
}

// nodeState is what one node holds for the lock.
type nodeState struct {
	value   string        // the lock key's value, "<random>:<token>"; "" when free
	pttl    time.Duration // remaining TTL of the lock key; -1 if it has none
	counter string        // the fence counter, "" when absent
	err     error
}

// readNode reads the lock key, its TTL and the fence counter from one node,
// in one transaction so that they agree.
func readNode(ctx context.Context, pool *redis.Pool, keys keyspace.Keys) (s nodeState) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	c, err := pool.GetContext(ctx)
	if err != nil {
		return nodeState{err: err}
	}
	defer c.Close()
	c.Send("MULTI")
	c.Send("GET", keys.Lock)
	c.Send("PTTL", keys.Lock)
	c.Send("GET", keys.Fence)
	vals, err := redis.Values(redis.DoContext(c, ctx, "EXEC"))
	if err == nil && len(vals) != 3 {
		err = fmt.Errorf("EXEC replied %v", vals)
	}
	if err != nil {
		return nodeState{err: err}
	}
	for _, v := range vals {
		if e, ok := v.(redis.Error); ok {
			return nodeState{err: e} // WRONGTYPE, say
		}
	}
	s.value, _ = redis.String(vals[0], nil)
	pttl, _ := redis.Int64(vals[1], nil)
	s.pttl = time.Duration(pttl) * time.Millisecond
	s.counter, _ = redis.String(vals[2], nil)
	return s
}

// token returns the fencing token in the lock key's value "<random>:<token>"
// (see lua/acquire.lua), or "?" if the value is not netlock's.
func (s nodeState) token() string {
	i := strings.LastIndexByte(s.value, ':')
	if _, err := strconv.ParseUint(s.value[i+1:], 10, 64); i < 0 || err != nil {
		return "?"
	}
	return s.value[i+1:]
}

// String renders the state as the table's columns after NODE.
func (s nodeState) String() string {
	counter := s.counter
	if counter == "" {
		counter = "0"
	}
	switch {
	case s.err != nil:
		return "error\t-\t-\t-"
	case s.value == "":
		return "free\t-\t-\t" + counter
	case s.pttl < 0:
		return "held\tnone\t" + s.token() + "\t" + counter
	}
	return "held\t" + s.pttl.String() + "\t" + s.token() + "\t" + counter
}

// judge decides from the nodes' states whether the lock is held: a majority
// of the nodes hold its key with one value. It returns the exit code and a
// summary.
func judge(states []nodeState) (code int, summary string) {
	n, quorum := len(states), len(states)/2+1
	count := map[string]int{}
	failed, keyed, most, holder := 0, 0, 0, ""
	for _, s := range states {
		switch {
		case s.err != nil:
			failed++
		case s.value != "":
			keyed++
			count[s.value]++
			if count[s.value] > most {
				most, holder = count[s.value], s.value
			}
		}
	}
	of := ""
	if n > 1 {
		of = fmt.Sprintf(" on %d of %d nodes", most, n)
	}
	switch {
	case most >= quorum:
		return exitHeld, fmt.Sprintf("held, fencing token %s%s", nodeState{value: holder}.token(), of)
	case most+failed >= quorum:
		return exitUsage, fmt.Sprintf("unknown: %d of %d nodes did not answer", failed, n)
	case keyed > 0:
		return exitFree, fmt.Sprintf("free (a key is left on %d of %d nodes, but no holder has a quorum of %d)", keyed, n, quorum)
	}
	return exitFree, "free"
}
