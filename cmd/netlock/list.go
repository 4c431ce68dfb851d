package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/keyspace"
)

const listHelp = `Usage: netlock list [flags]

Lists the locks held under --prefix on each Redis node: NetMutex locks
(MultiMutex names too), NetRWMutex writers and read leases, Semaphore
leases, Election leaders' holds, and the locks of Once runs under way
(what "netlock once" runs under), sorted by name.
It changes nothing in Redis. Waiters' queues, tombstones of released
values and fence counters are not locks and are not listed; a name whose
only keys are those (waiters, but no holder) is not held.

It walks the keys with SCAN (MATCH <prefix>{*, COUNT 1000 a call; never
KEYS) and reads each page's keys in one pipeline. SCAN still steps through
the node's whole keyspace, the keys of other applications too, a thousand
slots at a time. --limit bounds the keys under the prefix that it looks
at: when there are more, it lists what it read, says so on stderr, and
exits with 1. On a Redis Cluster node (cluster_enabled:1) it lists every
master that serves slots, found with CLUSTER NODES, with the same
credentials and TLS.

Columns: NAME (the {name} of the keys), KIND (mutex, rw-write, rw-read,
semaphore, election, once), TOKEN (the fencing token of a mutex, a writer
or a once's run, the term of an election's leader: 0 with fencing off, ?
for a value netlock did not write, - for read leases and semaphores, which
have none), TTL (what is left of the key's TTL, or of the last lease's
deadline; none: no TTL), HELD (1 for a mutex, writer, leader or once; the
live read leases; the
permits out of the semaphore's size), NODE when
more than one node is listed, and HOLDER: who holds it, the identity the
holder wrote with its hold (netlock.WithHolderInfo, by default
"<hostname>/<pid>" of its process; - for none), the identities of the
live leases for read leases and semaphores, comma-separated.

--json prints one JSON array of objects with "node", "name", "kind",
"token" (null where there is none), "foreign", "ttl_ms" (-1: no TTL),
"leases" (read leases, or processes holding permits), "permits" and "size"
(a semaphore's permits out and size; 0 otherwise), and "holders" (the
holders' identities: one for a mutex, writer or leader, one per live lease that
wrote one; none for a value netlock did not write).

Exit status: 0 listed, 1 --limit reached (the list is incomplete), 64 bad
usage, 69 a node could not be listed (not reachable, not answering, not a
Redis server, or answering with an error; the other nodes' locks are
listed, and nothing is printed on stdout when no node could be).

` + connHelp + `
Flags:
`

const (
	listScanCount    = 1000            // SCAN's COUNT
	listDefaultLimit = 1_000_000       // --limit's default
	listTimeout      = 5 * time.Second // bounds each round trip to a node, dialling included
	exitTruncated    = 1               // list: --limit was reached
)

// Kinds of hold, in the order a name's rows are listed.
const (
	kindMutex   = "mutex"
	kindRWWrite = "rw-write"
	kindRWRead  = "rw-read"
	kindSem     = "semaphore"
	kindElect   = "election"
	kindOnce    = "once" // a Once's lock: a run under way
)

var kindOrder = []string{kindMutex, kindRWWrite, kindRWRead, kindSem, kindElect, kindOnce}

// A listRow is one held lock on one node.
type listRow struct {
	Node    string   `json:"node"`
	Name    string   `json:"name"`
	Kind    string   `json:"kind"`
	Token   *uint64  `json:"token"`   // null: the kind has none, or a value netlock did not write
	Foreign bool     `json:"foreign"` // the key holds a value (or a type) netlock did not write
	TTLMS   int64    `json:"ttl_ms"`  // -1: no TTL
	Leases  int      `json:"leases"`  // rw-read: read leases; semaphore: processes holding permits
	Permits int      `json:"permits"` // semaphore: permits out
	Size    int      `json:"size"`    // semaphore: its size
	Holders []string `json:"holders"` // the holders' identities (WithHolderInfo), [] for none
}

// A listPattern tells the keys of one kind apart: head + name + tail, the
// names keyspace gives, so that list and the library always agree.
type listPattern struct {
	kind string
	tail string
}

// listPatterns returns the head every lock key starts with under prefix,
// and the tail of each kind's key, derived from keyspace.
func listPatterns(prefix string) (head string, pats []listPattern) {
	const marker = "\x00"
	split := func(key string) (string, string) {
		h, t, _ := strings.Cut(key, marker)
		return h, t
	}
	head, mutexTail := split(keyspace.New(prefix, marker, false).Lock)
	_, writerTail := split(keyspace.RW(prefix, marker, false).Writer)
	_, leasesTail := split(keyspace.RW(prefix, marker, false).Leases)
	_, semTail := split(keyspace.Sem(prefix, marker).Leases)
	_, electTail := split(keyspace.Election(prefix, marker).Lock)
	_, onceTail := split(keyspace.Once(prefix, marker, false).Lock)
	// Longest tails first: "}:rw:leases" before "}:rw" (no tail ends
	// another, but the order keeps it so if one ever does).
	pats = []listPattern{{kindRWRead, leasesTail}, {kindRWWrite, writerTail}, {kindSem, semTail}, {kindElect, electTail}, {kindOnce, onceTail}, {kindMutex, mutexTail}}
	slices.SortStableFunc(pats, func(a, b listPattern) int { return len(b.tail) - len(a.tail) })
	return head, pats
}

// classify returns the kind and name of key, or "" if key is none of the
// keys that hold a lock (a queue, a tombstone, a fence counter, ...).
func classify(key, head string, pats []listPattern) (kind, name string) {
	if !strings.HasPrefix(key, head) {
		return "", ""
	}
	rest := key[len(head):]
	for _, p := range pats {
		if n, ok := strings.CutSuffix(rest, p.tail); ok && n != "" && n[0] != '}' {
			return p.kind, n
		}
	}
	return "", ""
}

// globEscape escapes the characters SCAN's MATCH takes as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// runList runs "netlock list" with args and returns the exit code.
func runList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newSubcommand("list", listHelp, stdout, stderr)
	fs := cmd.fs
	asJSON := fs.Bool("json", false, "print the locks as one JSON array (see above)")
	limit := listDefaultLimit
	fs.Var(&intValue{p: &limit, min: 1}, "limit", "look at no more than `n` keys under the prefix")
	if code, done := cmd.parse(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return cmd.bad("unexpected %q: list takes no arguments, only flags", fs.Arg(0))
	}
	if cmd.cf.prefix == "" {
		return cmd.bad("%s", badValue("--prefix", "", "want the prefix of netlock's keys, such as "+strconv.Quote(netlock.DefaultPrefix)+": an empty one would match every key that starts with '{'"))
	}
	c, code, bad := cmd.conn()
	if bad {
		return code
	}

	l := &lister{limit: limit, stderr: stderr}
	l.head, l.pats = listPatterns(c.prefix)
	l.match = globEscape(l.head) + "*"
	l.sem = func(name string) string { return keyspace.Sem(c.prefix, name).Permits }

	failed := false
	for _, n := range c.nodes {
		if !l.node(ctx, n) {
			failed = true
		}
		if l.truncated || ctx.Err() != nil {
			break
		}
	}
	if failed && l.listed == 0 {
		// No node was listed: an empty table (or []) would read as "no
		// locks held"; stderr says why instead.
		if ctx.Err() != nil {
			return exitInterrupted
		}
		return exitUnavailable
	}
	rows := l.rows
	slices.SortStableFunc(rows, func(a, b listRow) int {
		return cmp.Or(strings.Compare(a.Name, b.Name),
			cmp.Compare(slices.Index(kindOrder, a.Kind), slices.Index(kindOrder, b.Kind)),
			cmp.Compare(l.nodeOrder[a.Node], l.nodeOrder[b.Node]))
	})
	if *asJSON {
		if rows == nil {
			rows = []listRow{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rows)
	} else {
		printList(stdout, rows, len(c.nodes) > 1 || len(l.nodeOrder) > 1)
	}
	switch {
	case ctx.Err() != nil:
		return exitInterrupted
	case failed:
		return exitUnavailable
	case l.truncated:
		fmt.Fprintf(stderr, "netlock list: stopped at --limit %d keys under the prefix %q: there are more, and locks among them are not listed; raise --limit or narrow --prefix\n", limit, c.prefix)
		return exitTruncated
	}
	return exitOK
}

// printList writes rows as a table.
func printList(w io.Writer, rows []listRow, nodes bool) {
	bw := bufio.NewWriter(w) // tabwriter writes cell by cell
	defer bw.Flush()
	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	header := "NAME\tKIND\tTOKEN\tTTL\tHELD"
	if nodes {
		header += "\tNODE"
	}
	header += "\tHOLDER"
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		token := "-"
		switch {
		case r.Foreign:
			token = "?"
		case r.Token != nil:
			token = strconv.FormatUint(*r.Token, 10)
		}
		ttl := "none"
		if r.TTLMS >= 0 {
			ttl = (time.Duration(r.TTLMS) * time.Millisecond).String()
		}
		held := "1"
		switch r.Kind {
		case kindRWRead:
			held = fmt.Sprintf("%d leases", r.Leases)
			if r.Leases == 1 {
				held = "1 lease"
			}
		case kindSem:
			held = fmt.Sprintf("%d/%d permits", r.Permits, r.Size)
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", r.Name, r.Kind, token, ttl, held)
		if nodes {
			line += "\t" + r.Node
		}
		holders := "-"
		if len(r.Holders) > 0 {
			holders = strings.Join(r.Holders, ",")
		}
		fmt.Fprintln(tw, line+"\t"+holders)
	}
	tw.Flush()
}

// A lister collects the held locks of the nodes it is given.
type lister struct {
	head      string
	pats      []listPattern
	match     string
	sem       func(name string) string // a semaphore's permits key
	limit     int
	seen      int // keys under the prefix looked at, over all nodes
	truncated bool
	rows      []listRow
	nodeOrder map[string]int // the nodes listed, in order
	listed    int            // the nodes (cluster masters) whose scan completed
	stderr    io.Writer
}

// node lists n, or every master of the cluster n belongs to. It reports
// false, after saying why on stderr, if a node could not be listed.
func (l *lister) node(ctx context.Context, n node) bool {
	conn, err := l.dial(ctx, n)
	if err != nil {
		l.fail(n, err)
		return false
	}
	masters, err := clusterMasters(ctx, conn, n)
	if err != nil {
		conn.Close()
		l.fail(n, err)
		return false
	}
	if masters == nil {
		defer conn.Close()
		return l.scan(ctx, conn, n)
	}
	conn.Close()
	ok := true
	for _, m := range masters {
		conn, err := l.dial(ctx, m)
		if err == nil {
			ok = l.scan(ctx, conn, m) && ok
			conn.Close()
		} else {
			l.fail(m, err)
			ok = false
		}
		if l.truncated || ctx.Err() != nil {
			break
		}
	}
	return ok
}

func (l *lister) dial(ctx context.Context, n node) (redis.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	return n.dial(ctx)
}

// fail says on stderr why n could not be listed, as status words it.
func (l *lister) fail(n node, err error) {
	if err == nil {
		return
	}
	c := &conn{nodes: []node{n}}
	fmt.Fprintf(l.stderr, "netlock list: %s\n", c.failure(err))
	if h := authHint(err); h != "" {
		fmt.Fprintf(l.stderr, "netlock list: %s\n", h)
	}
}

// clusterMasters returns the masters that serve slots in the cluster of the
// node conn is connected to, or nil if that node is not in cluster mode. A
// server that refuses INFO cluster (an error reply: miniredis, or an ACL
// user without +info) is taken as not in cluster mode.
func clusterMasters(ctx context.Context, conn redis.Conn, n node) ([]node, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	info, err := redis.String(redis.DoContext(conn, ctx, "INFO", "cluster"))
	if isReply(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !strings.Contains(info, "cluster_enabled:1") {
		return nil, nil
	}
	text, err := redis.String(redis.DoContext(conn, ctx, "CLUSTER", "NODES"))
	if err != nil {
		return nil, err
	}
	var masters []node
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		// <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot> ...
		f := strings.Fields(line)
		if len(f) < 9 {
			continue // no slots
		}
		flags := "," + f[2] + ","
		if !strings.Contains(flags, ",master,") || strings.Contains(flags, ",fail,") || strings.Contains(flags, ",noaddr,") || strings.Contains(flags, ",handshake,") {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		addr, _, _ = strings.Cut(addr, ",")
		m := n
		if !strings.Contains(flags, ",myself,") || !strings.HasPrefix(addr, ":") {
			m.network, m.address, m.name = "tcp", addr, addr
		}
		masters = append(masters, m)
	}
	if len(masters) == 0 {
		return nil, fmt.Errorf("cluster_enabled:1, but CLUSTER NODES names no master that serves slots")
	}
	slices.SortFunc(masters, func(a, b node) int { return strings.Compare(a.address, b.address) })
	return masters, nil
}

// scan lists the held locks of the node conn is connected to, n, page by
// page: a SCAN, then one pipeline that reads the page's lock keys.
func (l *lister) scan(ctx context.Context, conn redis.Conn, n node) bool {
	if l.nodeOrder == nil {
		l.nodeOrder = map[string]int{}
	}
	if _, ok := l.nodeOrder[n.name]; !ok {
		l.nodeOrder[n.name] = len(l.nodeOrder)
	}
	seen := map[string]bool{} // SCAN may return a key twice
	cursor := "0"
	for {
		var keys []string
		var err error
		cursor, keys, err = scanPage(ctx, conn, cursor, l.match)
		if err != nil {
			l.fail(n, err)
			return false
		}
		var page []string
		for _, k := range keys {
			if seen[k] {
				continue
			}
			if l.seen == l.limit {
				l.truncated = true
				break
			}
			seen[k] = true
			l.seen++
			page = append(page, k)
		}
		if err := l.read(ctx, conn, n, page); err != nil {
			l.fail(n, err)
			return false
		}
		if cursor == "0" || l.truncated {
			l.listed++
			return true
		}
		if l.seen == l.limit {
			// More may follow: one more SCAN would tell, but the limit
			// is on what is looked at.
			l.truncated = true
			l.listed++
			return true
		}
	}
}

func scanPage(ctx context.Context, conn redis.Conn, cursor, match string) (string, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	reply, err := redis.Values(redis.DoContext(conn, ctx, "SCAN", cursor, "MATCH", match, "COUNT", listScanCount))
	if err != nil {
		return "", nil, err
	}
	if len(reply) != 2 {
		return "", nil, fmt.Errorf("SCAN answered %d items, want 2", len(reply))
	}
	next, err := redis.String(reply[0], nil)
	if err != nil {
		return "", nil, err
	}
	keys, err := redis.Strings(reply[1], nil)
	return next, keys, err
}

// tokenValue matches a value netlock writes to a lock or writer key:
// "<value>:<token>:<holder>", or "<value>:<token>" (inspect.lua's patterns).
var tokenValue = regexp.MustCompile(`^[^:]+:([0-9]+)(:[^:]*)?$`)

// read reads the lock keys among keys in one pipeline: TIME, then for a
// mutex or writer key GET and PTTL, for a read leases key its leases (the
// positive scores: waiters' places are negative), for a semaphore its
// leases and its permits hash.
func (l *lister) read(ctx context.Context, conn redis.Conn, n node, keys []string) error {
	items := l.sendReads(conn, keys)
	if len(items) == 0 {
		return nil
	}
	replies, now, err := receiveReads(ctx, conn)
	if err != nil {
		return err
	}
	for _, it := range items {
		if row, held := readRow(n, it, &replies, now); held {
			l.rows = append(l.rows, row)
		}
	}
	return nil
}

// A listItem is a lock key of a page, whose reads are in the pipeline.
type listItem struct {
	kind, name string
}

// sendReads queues, on conn, the reads of the lock keys among keys, and
// returns those keys in order. It queues nothing for the others.
func (l *lister) sendReads(conn redis.Conn, keys []string) []listItem {
	var items []listItem
	for _, k := range keys {
		kind, name := classify(k, l.head, l.pats)
		if kind == "" {
			continue
		}
		items = append(items, listItem{kind: kind, name: name})
		switch kind {
		case kindMutex, kindRWWrite, kindElect, kindOnce:
			conn.Send("GET", k)
			conn.Send("PTTL", k)
		case kindRWRead:
			conn.Send("ZRANGEBYSCORE", k, "(0", "+inf", "WITHSCORES")
		case kindSem:
			conn.Send("ZRANGE", k, 0, -1, "WITHSCORES")
			conn.Send("HGETALL", l.sem(name))
		}
	}
	return items
}

// A listReply is one reply of the pipeline: a value, or the error reply
// that took its place.
type listReply struct {
	v   any
	err error
}

// listReplies are the replies of the pipeline not yet taken, in the order
// their commands were sent.
type listReplies []listReply

// next takes the first reply left.
func (r *listReplies) next() listReply {
	first := (*r)[0]
	*r = (*r)[1:]
	return first
}

// receiveReads sends TIME after the reads queued on conn, flushes them, and
// returns their replies and the server's time in ms. Its error is that of
// the round trip, or of a TIME reply that is not a time.
func receiveReads(ctx context.Context, conn redis.Conn) (listReplies, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	// TIME last: the leases' deadlines are in the server's clock, and a
	// deadline read before TIME that TIME puts in the past has passed.
	if err := conn.Send("TIME"); err != nil {
		return nil, 0, err
	}
	// Flushed and received in one call, each error reply (WRONGTYPE) in
	// its place among the others (redigo's Do("")).
	all, err := redis.Values(redis.DoContext(conn, ctx, ""))
	if err != nil {
		return nil, 0, err
	}
	replies := make(listReplies, len(all)-1)
	for i, v := range all[:len(all)-1] {
		replies[i].v = v
		if e, ok := v.(redis.Error); ok {
			replies[i] = listReply{nil, e}
		}
	}
	t, err := redis.Int64s(all[len(all)-1], nil)
	if err != nil || len(t) != 2 {
		return nil, 0, fmt.Errorf("TIME: %v", err)
	}
	return replies, t[0]*1000 + t[1]/1000, nil
}

// readRow returns the row of it on n, from its replies, taken from rs, as
// of the server's time now. It reports false if it is no longer held.
func readRow(n node, it listItem, rs *listReplies, now int64) (listRow, bool) {
	row := listRow{Node: n.name, Name: it.name, Kind: it.kind, TTLMS: -1, Holders: []string{}}
	switch it.kind {
	case kindMutex, kindRWWrite, kindElect, kindOnce:
		get, pttl := rs.next(), rs.next()
		return keyRow(row, get, pttl)
	case kindRWRead:
		return leasesRow(row, rs.next(), now)
	case kindSem:
		z, h := rs.next(), rs.next()
		row, held := leasesRow(row, z, now)
		if held && !row.Foreign {
			row.Permits, row.Size, row.Foreign = semPermits(z.v, h.v, h.err, now)
		}
		return row, held
	}
	return row, true
}

// keyRow fills in row from a key's GET and PTTL: its TTL, and its token and
// holder if netlock wrote its value. It reports false if the key is gone.
func keyRow(row listRow, get, pttl listReply) (listRow, bool) {
	if get.v == nil && get.err == nil {
		return row, false // released or expired since the SCAN
	}
	if ms, err := redis.Int64(pttl.v, pttl.err); err == nil {
		if ms == -2 {
			return row, false
		}
		row.TTLMS = ms
	}
	row.Foreign = true
	if v, err := redis.String(get.v, get.err); err == nil {
		if m := tokenValue.FindStringSubmatch(v); m != nil {
			if tok, err := strconv.ParseUint(m[1], 10, 64); err == nil {
				row.Token, row.Foreign = &tok, false
			}
			if h := keyspace.HolderOf(v); h != "" && !row.Foreign {
				row.Holders = append(row.Holders, h)
			}
		}
	}
	return row, true
}

// leasesRow fills in row from a sorted set of leases z, as of now: the live
// leases, the time left to the last one, and their holders. It reports
// false if none is live.
func leasesRow(row listRow, z listReply, now int64) (listRow, bool) {
	leases, last, holders, ok := liveLeases(z.v, z.err, now)
	if ok && leases == 0 {
		return row, false
	}
	row.Foreign = !ok
	row.Leases, row.TTLMS, row.Holders = leases, last, holders
	return row, true
}

// liveLeases reads a sorted set of leases (member: value, score: deadline
// in server ms) as of now: how many are live, the time left to the last
// deadline, and the identities their holders wrote (at the end of each
// value: keyspace.LeaseHolder), in the set's order. ok is false if it is
// not a sorted set of deadlines.
func liveLeases(v any, err error, now int64) (live int, lastMS int64, holders []string, ok bool) {
	m, err := redis.Strings(v, err)
	holders = []string{}
	if err != nil || len(m)%2 != 0 {
		return 0, -1, holders, false
	}
	for i := 1; i < len(m); i += 2 {
		dl, err := strconv.ParseFloat(m[i], 64)
		if err != nil {
			return 0, -1, []string{}, false
		}
		if int64(dl) > now {
			live++
			lastMS = max(lastMS, int64(dl)-now)
			if h := keyspace.LeaseHolder(m[i-1]); h != "" {
				holders = append(holders, h)
			}
		}
	}
	return live, lastMS, holders, true
}

// semPermits counts, as sem_inspect.lua does, the permits out of a
// semaphore (the live leases' counts and the grants set aside for
// waiters) and its size, from its leases z and its permits hash h.
func semPermits(z, h any, herr error, now int64) (permits, size int, foreign bool) {
	m, err := redis.StringMap(h, herr)
	if err != nil {
		return 0, 0, true
	}
	leases, _ := redis.Strings(z, nil)
	for i := 0; i+1 < len(leases); i += 2 {
		dl, _ := strconv.ParseFloat(leases[i+1], 64)
		if int64(dl) <= now {
			continue
		}
		v := leases[i]
		n, _ := strconv.Atoi(m[v])
		permits += n
		if g, ok := m[v+"#g"]; ok {
			_, gn, _ := strings.Cut(g, ":")
			n, _ := strconv.Atoi(gn)
			permits += n
		}
	}
	size, _ = strconv.Atoi(m["#size"])
	return permits, size, false
}
