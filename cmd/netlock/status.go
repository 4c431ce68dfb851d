package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/netlock-go/netlock"
)

const statusHelp = `Usage: netlock status [flags] NAME

Shows whether the lock NAME is held, on each Redis node: the remaining TTL
of its key, the holder's fencing token, the clients queued for it, the
node's fence counter (the highest token it has granted in the key's hash
slot), and who holds it: the identity the holder wrote with its hold
(netlock.WithHolderInfo, by default "<hostname>/<pid>" of its process; -
for none). It changes nothing in Redis.

The lock is held when a majority of the nodes (one of one) hold its key with
one holder's value; a key on fewer nodes is left over from an acquire that
failed or a hold that expired elsewhere, and no longer excludes anyone.
netlock.Inspect decides, as in a Go program.

NAME is a NetMutex (what "netlock run" takes), a NetRWMutex, a Semaphore or
a Once (what "netlock once" takes): status tells which by the keys NAME has
in Redis (a name with none is free, whatever its kind). A NetMutex, a
NetRWMutex, a Semaphore and a Once of one name are different locks: where
more than one of them has keys, status names them and exits 64, and --kind
says which to show. For a NetRWMutex (NetRWMutex.Inspect) it shows the
writer (fencing token, TTL, holder), the read leases (one per process whose
readers hold, with its holder), and the writers and readers waiting; for a
Semaphore (Semaphore.Inspect), its size, the permits out, the leases and
their holders, and the processes waiting; for a Once (Once.Inspect),
whether it is done (by which run: fencing token, holder, when, remembered
for how long), and its lock as a NetMutex's: held while a run is under way.

A node whose maxmemory-policy can evict keys with a TTL (volatile-*,
allkeys-*) can drop the lock's key under its holder: status warns about it
on stderr. netlock needs maxmemory-policy noeviction.

--json prints the same as one JSON object, with "kind" (mutex, rw,
semaphore or once). For a NetMutex: "state" (held, free or unknown), "token",
"ttl_ms" (-1: no TTL), "holder" (12 hex digits that tell holds apart),
"holder_info" (the holder's identity), and "nodes", each with "addr",
"state" (held, free or error), "token", "foreign" (a value netlock did not
write), "ttl_ms", "holder", "holder_info", "waiters", "fence_counter",
"maxmemory_policy", "maxmemory" (bytes, 0: no limit, -1: unknown), "evicts"
and "error". For a NetRWMutex, the writer's fields as a NetMutex's, with
"writer" (whether a writer holds), "readers" (each read lease's "holder",
"holder_info" and "ttl_ms"), and nodes with "state" write, read, free or
error, "leases", "write_waiters" and "read_waiters". For a Semaphore:
"state", "addr", "size", "permits" (out), "leases", "waiters", "holders"
and "error". For a Once: "state" (done, not done or unknown), "running",
the recorded run's "token", "holder_info", "at" and "ttl_ms" (-1: until
Forget), and "lock", its lock as a NetMutex's.

Exit status: 0 free, 1 held (a NetRWMutex by a writer or by readers, a
Semaphore by any lease, a Once by a run under way), 64 bad usage (or keys
of several kinds without --kind), 69 too few nodes answered to tell (not
reachable, not answering, not a Redis server, or answering with an error).

` + connHelp + `
Flags:
`

// statusTimeout bounds each node's answer, dialling included.
const statusTimeout = 2 * time.Second

// runStatus runs "netlock status" with args (the arguments after "status")
// and returns the exit code.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newSubcommand("status", statusHelp, stdout, stderr)
	asJSON := cmd.fs.Bool("json", false, "print the status as JSON (see above)")
	var kind string
	cmd.fs.Var(&choiceValue{p: &kind, choices: statusKinds}, "kind", "the `kind` of lock NAME is: mutex, rw, semaphore or once (default: the kind whose keys NAME has)")
	if code, done := cmd.parse(args); done {
		return code
	}
	name, code, bad := cmd.lockName()
	if bad {
		return code
	}
	c, code, bad := cmd.conn()
	if bad {
		return code
	}

	pools := c.pools()
	defer closePools(pools)
	if kind == "" {
		switch kinds := detectKinds(ctx, pools, c.prefix, name); len(kinds) {
		case 0:
			kind = statusMutex // free, whatever its kind
		case 1:
			kind = kinds[0]
		default:
			return cmd.bad("%q has the keys of %s, different locks of one name: give --kind %s", name, kindList(kinds), strings.Join(kinds, " or --kind "))
		}
	}
	s := &statusRun{cmd: cmd, name: name, c: c, backends: backends(pools), asJSON: *asJSON, stdout: stdout, stderr: stderr}
	switch kind {
	case statusRW:
		return s.rw(ctx)
	case statusSem:
		return s.sem(ctx)
	case statusOnce:
		return s.once(ctx)
	}
	return s.mutex(ctx)
}

// mutex shows the NetMutex name and returns the exit code.
func (s *statusRun) mutex(ctx context.Context) int {
	c := s.c
	info, err := netlock.Inspect(ctx, s.name, s.backends, netlock.WithPrefix(c.prefix), netlock.WithNodeTimeout(statusTimeout))
	if err != nil && !errors.Is(err, netlock.ErrQuorum) {
		// Inspect validates the name as New does: one rule for every
		// command.
		return s.cmd.bad("%s", oneLine(err))
	}
	code := exitFree
	switch {
	case err != nil:
		code = exitUnavailable
	case info.Held:
		code = exitHeld
	}

	if s.asJSON {
		s.printJSON(statusJSON(s.name, c, info, err))
	} else {
		fmt.Fprintf(s.stdout, "lock %q: %s\n", s.name, summary(c, info, err))
		tw := tabwriter.NewWriter(s.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tSTATE\tTTL\tTOKEN\tWAITERS\tFENCE COUNTER\tHOLDER")
		for i, n := range info.Nodes {
			fmt.Fprintf(tw, "%s\t%s\n", c.nodes[i].name, row(n))
		}
		tw.Flush()
	}
	nodeWarnings(s.stderr, c, info.Nodes)
	return code
}

// nodeWarnings says on stderr why each node of nodes that failed did, and
// warns of each node whose maxmemory-policy can evict the lock's keys.
func nodeWarnings(stderr io.Writer, c *conn, nodes []netlock.NodeInfo) {
	for i, n := range nodes {
		who := c.nodes[i].name
		if len(nodes) > 1 {
			who = fmt.Sprintf("node %d %s", i, who)
		}
		if n.Err != nil {
			fmt.Fprintf(stderr, "netlock status: %s: %s\n", who, nodeErrorText(i, n.Err))
			if h := authHint(n.Err); h != "" {
				fmt.Fprintf(stderr, "netlock status: %s\n", h)
			}
		}
		if n.Evicts() {
			fmt.Fprintf(stderr, "netlock status: warning: %s has maxmemory-policy %s, which can evict the lock's key under its holder%s; netlock needs noeviction\n",
				who, n.MaxMemoryPolicy, maxmemoryText(n.MaxMemory))
		}
	}
}

// summary says in a few words what Inspect found on c's nodes: held (by
// which token, for how long), free, or unknown (why).
func summary(c *conn, info netlock.Info, err error) string {
	n := len(info.Nodes)
	keyed, failed := 0, 0
	for _, node := range info.Nodes {
		switch {
		case node.Err != nil:
			failed++
		case node.Held:
			keyed++
		}
	}
	switch {
	case err != nil && n == 1:
		return "unknown: " + c.failure(info.Nodes[0].Err)
	case err != nil:
		return fmt.Sprintf("unknown: %d of %d nodes failed, and a quorum of %d cannot be told without them", failed, n, n/2+1)
	case info.Held:
		return "held, " + holdText(info)
	case keyed > 0:
		return fmt.Sprintf("free (a key is left on %d of %d nodes, but no holder has a quorum of %d)", keyed, n, n/2+1)
	}
	return "free"
}

// holdText describes the hold Inspect found, for a message: "fencing token
// 7, TTL 9.5s", with " on 2 of 3 nodes" over several, and `, holder
// "web-1/4242"` where the holder wrote its identity.
func holdText(info netlock.Info) string {
	var s string
	switch {
	case info.Token != 0:
		s = "fencing token " + strconv.FormatUint(info.Token, 10)
	case anyForeign(info):
		s = "by a key netlock did not write"
	default:
		s = "no fencing token (fencing off)"
	}
	if n := len(info.Nodes); n > 1 {
		on := 0
		for _, node := range info.Nodes {
			if node.Err == nil && node.Held && node.Holder == info.Holder {
				on++
			}
		}
		s += fmt.Sprintf(" on %d of %d nodes", on, n)
	}
	s += ", " + ttlText(info.TTL)
	if info.HolderInfo != "" {
		s += ", holder " + strconv.Quote(info.HolderInfo)
	}
	return s
}

// anyForeign reports whether the hold's nodes hold a value netlock did not
// write.
func anyForeign(info netlock.Info) bool {
	for _, n := range info.Nodes {
		if n.Err == nil && n.Holder == info.Holder && n.Foreign {
			return true
		}
	}
	return false
}

// ttlText renders a hold's TTL for the summary.
func ttlText(ttl time.Duration) string {
	if ttl < 0 {
		return "no TTL"
	}
	return "TTL " + ttl.String()
}

// row renders a node's state as the table's columns after NODE.
func row(n netlock.NodeInfo) string {
	counter := strconv.FormatUint(n.FenceCounter, 10)
	waiters := strconv.Itoa(n.Waiters)
	token := strconv.FormatUint(n.Token, 10)
	if n.Foreign {
		token = "?"
	}
	holder := cmp.Or(n.HolderInfo, "-")
	switch {
	case n.Err != nil:
		return "error\t-\t-\t-\t-\t-"
	case !n.Held:
		return "free\t-\t-\t" + waiters + "\t" + counter + "\t-"
	case n.TTL < 0:
		return "held\tnone\t" + token + "\t" + waiters + "\t" + counter + "\t" + holder
	}
	return "held\t" + n.TTL.String() + "\t" + token + "\t" + waiters + "\t" + counter + "\t" + holder
}

// nodeErrorText is node i's error without the "netlock: node i: " the
// library names it with (the command names the node itself), and with a
// node that is not a Redis server said to be so.
func nodeErrorText(i int, err error) string {
	return protocolText(strings.TrimPrefix(err.Error(), fmt.Sprintf("netlock: node %d: ", i)))
}

// maxmemoryText says when a policy that evicts comes into play.
func maxmemoryText(maxmemory int64) string {
	switch {
	case maxmemory == 0:
		return " once maxmemory is set (it is not yet)"
	case maxmemory > 0:
		return fmt.Sprintf(" when its %d bytes of maxmemory are full", maxmemory)
	}
	return " when its memory is full"
}

// jsonStatus is status --json's output: netlock.Info, flattened for
// machines.
type jsonStatus struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`  // mutex
	State  string `json:"state"` // held, free, unknown
	Token  uint64 `json:"token"`
	TTLMS  int64  `json:"ttl_ms"` // -1: no TTL; 0 when not held
	Holder string `json:"holder,omitempty"`
	// HolderInfo is the holder's identity (WithHolderInfo).
	HolderInfo string     `json:"holder_info,omitempty"`
	Error      string     `json:"error,omitempty"`
	Nodes      []jsonNode `json:"nodes"`
}

type jsonNode struct {
	Addr            string `json:"addr"`
	State           string `json:"state"` // held, free, error
	Token           uint64 `json:"token"`
	Foreign         bool   `json:"foreign"`
	TTLMS           int64  `json:"ttl_ms"`
	Holder          string `json:"holder,omitempty"`
	HolderInfo      string `json:"holder_info,omitempty"`
	Waiters         int    `json:"waiters"`
	FenceCounter    uint64 `json:"fence_counter"`
	MaxMemoryPolicy string `json:"maxmemory_policy,omitempty"`
	MaxMemory       int64  `json:"maxmemory"`
	Evicts          bool   `json:"evicts"`
	Error           string `json:"error,omitempty"`
}

func statusJSON(name string, c *conn, info netlock.Info, err error) jsonStatus {
	s := jsonStatus{Name: name, Kind: statusMutex, State: "free", Token: info.Token, TTLMS: ttlMS(info.TTL), Holder: info.Holder, HolderInfo: info.HolderInfo, Nodes: []jsonNode{}}
	switch {
	case err != nil:
		s.State, s.Error = "unknown", oneLine(err)
	case info.Held:
		s.State = "held"
	}
	for i, n := range info.Nodes {
		j := jsonNode{
			Addr: c.nodes[i].name, State: "free", Token: n.Token, Foreign: n.Foreign, TTLMS: ttlMS(n.TTL), Holder: n.Holder, HolderInfo: n.HolderInfo,
			Waiters: n.Waiters, FenceCounter: n.FenceCounter, MaxMemoryPolicy: n.MaxMemoryPolicy, MaxMemory: n.MaxMemory, Evicts: n.Evicts(),
		}
		switch {
		case n.Err != nil:
			j.State, j.Error = "error", nodeErrorText(i, n.Err)
		case n.Held:
			j.State = "held"
		}
		s.Nodes = append(s.Nodes, j)
	}
	return s
}

func ttlMS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}
