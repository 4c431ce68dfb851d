package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/keyspace"
)

// The kinds of lock status shows, as --kind names them.
const (
	statusMutex = "mutex"
	statusRW    = "rw"
	statusSem   = "semaphore"
	statusOnce  = "once"
)

var statusKinds = []string{statusMutex, statusRW, statusSem, statusOnce}

// kindNames name the kinds in messages.
var kindNames = map[string]string{statusMutex: "NetMutex", statusRW: "NetRWMutex", statusSem: "Semaphore", statusOnce: "Once"}

// kindKeys returns, for each kind, the keys that exist while a lock of that
// kind called name is held or waited for: its lock or writer key, its
// leases, its queues; and a Once's record of its run. Tombstones and fence
// counters outlive the holds and say nothing.
func kindKeys(prefix, name string) map[string][]string {
	m := keyspace.New(prefix, name, false)
	rw := keyspace.RW(prefix, name, false)
	sem := keyspace.Sem(prefix, name)
	once := keyspace.Once(prefix, name, false)
	return map[string][]string{
		statusMutex: {m.Lock, m.Waiters},
		statusRW:    {rw.Writer, rw.Leases, rw.Writers, rw.Readers},
		statusSem:   {sem.Leases, sem.Permits, sem.Queue},
		statusOnce:  {once.Lock, once.Waiters, once.Done},
	}
}

// detectKinds returns the kinds of lock that have keys under name on the
// nodes of pools that answer, in statusKinds' order. A node that does not
// answer is left out: the status that follows reports it.
func detectKinds(ctx context.Context, pools []*redis.Pool, prefix, name string) []string {
	keys := kindKeys(prefix, name)
	found := make([]map[string]bool, len(pools))
	var wg sync.WaitGroup
	for i, p := range pools {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			conn, err := p.GetContext(ctx)
			if err != nil {
				return
			}
			defer conn.Close()
			for _, k := range statusKinds {
				conn.Send("EXISTS", redis.Args{}.AddFlat(keys[k])...)
			}
			n, err := redis.Ints(redis.DoContext(conn, ctx, ""))
			if err != nil || len(n) != len(statusKinds) {
				return
			}
			found[i] = map[string]bool{}
			for j, k := range statusKinds {
				found[i][k] = n[j] > 0
			}
		})
	}
	wg.Wait()
	var kinds []string
	for _, k := range statusKinds {
		for _, f := range found {
			if f[k] {
				kinds = append(kinds, k)
				break
			}
		}
	}
	return kinds
}

// kindList names kinds for a message: "a NetMutex and a NetRWMutex".
func kindList(kinds []string) string {
	var names []string
	for _, k := range kinds {
		names = append(names, "a "+kindNames[k])
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// A statusRun is one "netlock status" of a NetRWMutex or a Semaphore.
type statusRun struct {
	cmd            *subcommand
	name           string
	c              *conn
	backends       []netlock.Backend
	asJSON         bool
	stdout, stderr io.Writer
}

// rw shows the NetRWMutex name and returns the exit code.
func (s *statusRun) rw(ctx context.Context) int {
	rw, err := netlock.NewRW(s.name, s.backends, netlock.WithPrefix(s.c.prefix), netlock.WithNodeTimeout(statusTimeout))
	if err != nil {
		return s.cmd.bad("%s", oneLine(err))
	}
	info, err := rw.Inspect(ctx)
	code := exitFree
	switch {
	case err != nil:
		code = exitUnavailable
	case info.Held || len(info.Readers) > 0:
		code = exitHeld
	}
	if s.asJSON {
		s.printJSON(rwStatusJSON(s.name, s.c, info, err))
	} else {
		fmt.Fprintf(s.stdout, "rw lock %q: %s\n", s.name, rwSummary(s.c, info, err))
		tw := tabwriter.NewWriter(s.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tSTATE\tTTL\tTOKEN\tLEASES\tWRITERS WAITING\tREADERS WAITING\tFENCE COUNTER\tHOLDER")
		for i, n := range info.Nodes {
			fmt.Fprintf(tw, "%s\t%s\n", s.c.nodes[i].name, rwRow(n))
		}
		tw.Flush()
	}
	nodes := make([]netlock.NodeInfo, len(info.Nodes))
	for i, n := range info.Nodes {
		nodes[i] = n.NodeInfo
	}
	nodeWarnings(s.stderr, s.c, nodes)
	return code
}

// writerInfo is the write lock of info, as Inspect reports a NetMutex's.
func writerInfo(info netlock.RWInfo) netlock.Info {
	w := netlock.Info{Held: info.Held, Holder: info.Holder, HolderInfo: info.HolderInfo, Token: info.Token, TTL: info.TTL}
	for _, n := range info.Nodes {
		w.Nodes = append(w.Nodes, n.NodeInfo)
	}
	return w
}

// rwSummary says in a few words what NetRWMutex.Inspect found: held by a
// writer (which hold), by readers (their leases and holders), free, or
// unknown (why); and who waits.
func rwSummary(c *conn, info netlock.RWInfo, err error) string {
	w := writerInfo(info)
	var parts []string
	switch {
	case err != nil:
		return summary(c, w, err)
	case info.Held:
		parts = append(parts, "held by a writer, "+holdText(w))
	}
	if n := len(info.Readers); n > 0 {
		s := "held by readers on " + plural(n, "read lease")
		var holders []string
		for _, l := range info.Readers {
			if l.HolderInfo != "" {
				holders = append(holders, strconv.Quote(l.HolderInfo))
			}
		}
		if len(holders) > 0 {
			s += ", holders " + strings.Join(holders, ", ")
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		parts = append(parts, summary(c, w, nil)) // free, or keys short of a quorum
	}
	writers, readers := 0, 0
	for _, n := range info.Nodes {
		writers, readers = max(writers, n.Waiters), max(readers, n.ReadWaiters)
	}
	if writers+readers > 0 {
		parts = append(parts, fmt.Sprintf("waiting: %s, %s", plural(writers, "writer"), plural(readers, "reader")))
	}
	return strings.Join(parts, "; ")
}

// rwRow renders a node's state as the RW table's columns after NODE.
func rwRow(n netlock.RWNodeInfo) string {
	if n.Err != nil {
		return "error\t-\t-\t-\t-\t-\t-\t-"
	}
	state, ttl, token, holder := "free", "-", "-", "-"
	switch {
	case n.Held:
		state, ttl, token = "write", ttlCell(n.TTL), strconv.FormatUint(n.Token, 10)
		if n.Foreign {
			token = "?"
		}
		if n.HolderInfo != "" {
			holder = n.HolderInfo
		}
	case len(n.Leases) > 0:
		state, ttl = "read", ttlCell(n.Leases[len(n.Leases)-1].TTL) // the last to end
		var holders []string
		for _, l := range n.Leases {
			if l.HolderInfo != "" {
				holders = append(holders, l.HolderInfo)
			}
		}
		if len(holders) > 0 {
			holder = strings.Join(holders, ",")
		}
	}
	return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s", state, ttl, token, len(n.Leases), n.Waiters, n.ReadWaiters, n.FenceCounter, holder)
}

// ttlCell renders a TTL for a table: "none" for a key without one.
func ttlCell(ttl time.Duration) string {
	if ttl < 0 {
		return "none"
	}
	return ttl.String()
}

// sem shows the Semaphore name and returns the exit code.
func (s *statusRun) sem(ctx context.Context) int {
	// The size is the one in Redis: Inspect reads it, whatever this says.
	sem, err := netlock.NewSemaphore(s.name, 1, s.backends, netlock.WithPrefix(s.c.prefix), netlock.WithNodeTimeout(statusTimeout))
	if err != nil {
		return s.cmd.bad("%s", oneLine(err))
	}
	info, err := sem.Inspect(ctx)
	code := exitFree
	switch {
	case err != nil:
		code = exitUnavailable
	case info.Leases > 0:
		code = exitHeld
	}
	if s.asJSON {
		s.printJSON(semStatusJSON(s.name, s.c, info, err))
	} else {
		fmt.Fprintf(s.stdout, "semaphore %q: %s\n", s.name, semSummary(s.c, info, err))
		tw := tabwriter.NewWriter(s.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tSTATE\tSIZE\tPERMITS OUT\tLEASES\tWAITERS\tHOLDER")
		fmt.Fprintf(tw, "%s\t%s\n", s.c.nodes[0].name, semRow(info, err))
		tw.Flush()
	}
	if err != nil {
		fmt.Fprintf(s.stderr, "netlock status: %s: %s\n", s.c.nodes[0].name, nodeErrorText(0, quorumPart(err)))
		if h := authHint(err); h != "" {
			fmt.Fprintf(s.stderr, "netlock status: %s\n", h)
		}
	}
	return code
}

// semSummary says in a few words what Semaphore.Inspect found.
func semSummary(c *conn, info netlock.SemaphoreInfo, err error) string {
	var s string
	switch {
	case err != nil:
		return "unknown: " + c.failure(err)
	case info.Leases == 0:
		s = "free"
	default:
		s = fmt.Sprintf("held, %d of %d permits out, on %s", info.Out, info.Size, plural(info.Leases, "lease"))
		var holders []string
		for _, h := range info.Holders {
			if h != "" {
				holders = append(holders, strconv.Quote(h))
			}
		}
		if len(holders) > 0 {
			s += ", holders " + strings.Join(holders, ", ")
		}
	}
	if info.Waiters > 0 {
		s += "; waiting: " + plural(info.Waiters, "process")
	}
	return s
}

// semRow renders the semaphore's node as the table's columns after NODE.
func semRow(info netlock.SemaphoreInfo, err error) string {
	if err != nil {
		return "error\t-\t-\t-\t-\t-"
	}
	state, holder := "free", "-"
	if info.Leases > 0 {
		state = "held"
	}
	var holders []string
	for _, h := range info.Holders {
		if h != "" {
			holders = append(holders, h)
		}
	}
	if len(holders) > 0 {
		holder = strings.Join(holders, ",")
	}
	return fmt.Sprintf("%s\t%d\t%d\t%d\t%d\t%s", state, info.Size, info.Out, info.Leases, info.Waiters, holder)
}

func (s *statusRun) printJSON(v any) {
	enc := json.NewEncoder(s.stdout)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// jsonLease is one read lease in status --json.
type jsonLease struct {
	Holder     string `json:"holder"`
	HolderInfo string `json:"holder_info,omitempty"`
	TTLMS      int64  `json:"ttl_ms"`
}

// jsonRWStatus is status --json's output for a NetRWMutex.
type jsonRWStatus struct {
	Name       string       `json:"name"`
	Kind       string       `json:"kind"`
	State      string       `json:"state"` // held, free, unknown
	Writer     bool         `json:"writer"`
	Token      uint64       `json:"token"`
	TTLMS      int64        `json:"ttl_ms"`
	Holder     string       `json:"holder,omitempty"`
	HolderInfo string       `json:"holder_info,omitempty"`
	Readers    []jsonLease  `json:"readers"`
	Error      string       `json:"error,omitempty"`
	Nodes      []jsonRWNode `json:"nodes"`
}

// jsonRWNode is one node of a jsonRWStatus: its writer key (as status
// --json shows a NetMutex's lock key), its read leases, and its queues.
type jsonRWNode struct {
	Addr            string      `json:"addr"`
	State           string      `json:"state"` // write, read, free, error
	Token           uint64      `json:"token"`
	Foreign         bool        `json:"foreign"`
	TTLMS           int64       `json:"ttl_ms"`
	Holder          string      `json:"holder,omitempty"`
	HolderInfo      string      `json:"holder_info,omitempty"`
	Leases          []jsonLease `json:"leases"`
	WriteWaiters    int         `json:"write_waiters"`
	ReadWaiters     int         `json:"read_waiters"`
	FenceCounter    uint64      `json:"fence_counter"`
	MaxMemoryPolicy string      `json:"maxmemory_policy,omitempty"`
	MaxMemory       int64       `json:"maxmemory"`
	Evicts          bool        `json:"evicts"`
	Error           string      `json:"error,omitempty"`
}

func jsonLeases(leases []netlock.LeaseInfo) []jsonLease {
	out := []jsonLease{}
	for _, l := range leases {
		out = append(out, jsonLease{Holder: l.Holder, HolderInfo: l.HolderInfo, TTLMS: ttlMS(l.TTL)})
	}
	return out
}

func rwStatusJSON(name string, c *conn, info netlock.RWInfo, err error) jsonRWStatus {
	w := statusJSON(name, c, writerInfo(info), err)
	s := jsonRWStatus{Name: name, Kind: statusRW, State: w.State, Writer: info.Held, Token: w.Token, TTLMS: w.TTLMS, Holder: w.Holder, HolderInfo: w.HolderInfo,
		Readers: jsonLeases(info.Readers), Error: w.Error, Nodes: []jsonRWNode{}}
	if err == nil && len(info.Readers) > 0 {
		s.State = "held"
	}
	for i, n := range info.Nodes {
		wn := w.Nodes[i]
		j := jsonRWNode{Addr: wn.Addr, State: wn.State, Token: wn.Token, Foreign: wn.Foreign, TTLMS: wn.TTLMS, Holder: wn.Holder, HolderInfo: wn.HolderInfo,
			Leases: jsonLeases(n.Leases), WriteWaiters: wn.Waiters, ReadWaiters: n.ReadWaiters, FenceCounter: wn.FenceCounter,
			MaxMemoryPolicy: wn.MaxMemoryPolicy, MaxMemory: wn.MaxMemory, Evicts: wn.Evicts, Error: wn.Error}
		switch {
		case j.State == "held":
			j.State = "write"
		case j.State == "free" && len(n.Leases) > 0:
			j.State = "read"
		}
		s.Nodes = append(s.Nodes, j)
	}
	return s
}

// jsonSemStatus is status --json's output for a Semaphore.
type jsonSemStatus struct {
	Name    string   `json:"name"`
	Kind    string   `json:"kind"`
	State   string   `json:"state"` // held, free, unknown
	Addr    string   `json:"addr"`
	Size    int64    `json:"size"`
	Permits int64    `json:"permits"`
	Leases  int      `json:"leases"`
	Waiters int      `json:"waiters"`
	Holders []string `json:"holders"`
	Error   string   `json:"error,omitempty"`
}

func semStatusJSON(name string, c *conn, info netlock.SemaphoreInfo, err error) jsonSemStatus {
	s := jsonSemStatus{Name: name, Kind: statusSem, State: "free", Addr: c.nodes[0].name, Size: info.Size, Permits: info.Out,
		Leases: info.Leases, Waiters: info.Waiters, Holders: []string{}}
	for _, h := range info.Holders {
		if h != "" {
			s.Holders = append(s.Holders, h)
		}
	}
	switch {
	case err != nil:
		s.State, s.Error = "unknown", nodeErrorText(0, quorumPart(err))
	case info.Leases > 0:
		s.State = "held"
	}
	return s
}
