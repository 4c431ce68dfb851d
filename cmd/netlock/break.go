package main

import (
	"context"
	_ "embed"
	"errors"
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

const breakHelp = `Usage: netlock break [flags] NAME

Ends a hold of the NetMutex lock NAME by force, on each Redis node: in one
script per node it deletes the lock's key, raises the node's fence counter
to at least the broken hold's fencing token, and tells the first waiter in
the lock's queue that its turn has come, as a release does. That waiter
takes the lock at once, with a higher token than the broken hold's, so a
resource that keeps fencing tokens (package netlock/fence) refuses the
broken holder's writes once the new holder has written. The broken holder
learns that it lost the lock (NetMutex.Lost) at its next extend, or when its
local deadline passes, whichever comes first; until then it may still
believe it holds the lock: only fencing protects the resource meanwhile.

Without --force, break first checks that the holder is not alive: it reads
the key, waits a third of its TTL (the longest a live NetMutex goes between
two extends) and a quarter of a second more, and reads it again. If the
TTL went up (the holder extended it) or the key changed hands, break
refuses, names the hold by its fencing token and its holder's identity
(netlock.WithHolderInfo: "<hostname>/<pid>" unless the holder set its own),
and exits 1. It also refuses a key without a TTL or with a
value netlock did not write, and a wait longer than --check: the key's TTL
then says that a live holder may not extend within --check. --force breaks
at once, whatever holds the key, and asks nothing.

break handles NetMutex locks (what "netlock run" takes). A name held as a
NetRWMutex or a Semaphore is refused with exit 64: break does not end those
holds.

Over several --redis, break runs on every node that answers and reports
each; a node that cannot be reached is named, and break exits 69: its key,
if any, lasts until its TTL runs out. A Redis Cluster is not supported:
waiters there listen with sharded pub/sub, which break's PUBLISH does not
reach.

Exit status: 0 broken, or not held (nothing to break: the output says which);
1 refused (the holder is alive, the key is not one netlock wrote, has no TTL,
or would take longer than --check to tell); 64 bad usage, or a NetRWMutex or
Semaphore name; 69 a node could not be asked (not reachable, not answering,
not a Redis server, or answering with an error).

` + connHelp + `
Flags:
`

const (
	// breakTimeout bounds each node's answer, dialling included.
	breakTimeout = 2 * time.Second
	// breakCheckDefault is --check's default: enough to see a live holder
	// of the library's default expiry (8s) extend.
	breakCheckDefault = 3 * time.Second
	// extendsPerExpiry is how often a live NetMutex extends its hold per
	// expiry, at least (the library's own constant): its key's TTL never
	// falls below two thirds of the expiry, so a key with TTL t is
	// extended within t/3 if its holder is alive.
	extendsPerExpiry = 3
	// aliveMargin is added to that wait, for the holder's extend to reach
	// Redis (round trips, a GC pause, a busy host).
	aliveMargin = 250 * time.Millisecond
	// ttlSlack is what a key's TTL may read above what it should have
	// fallen to without an extend: Redis counts TTLs in whole
	// milliseconds.
	ttlSlack = 10 * time.Millisecond
	// breakWakeTries bounds the waiters break tries to tell, skipping
	// those nobody listens for: as many as a release tries.
	breakWakeTries = 8

	exitBroken  = 0 // break: broken, or not held
	exitRefused = 1 // break: the holder is alive, or the key is not one to break without --force
)

//go:embed break.lua
var breakLua string

var breakScript = netlock.NewScript("break", breakLua)

// runBreak runs "netlock break" with args and returns the exit code.
func runBreak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newSubcommand("break", breakHelp, stdout, stderr)
	fs := cmd.fs
	force := fs.Bool("force", false, "break the hold at once, even if its holder is alive (see above)")
	check := breakCheckDefault
	fs.Var(&durationValue{p: &check}, "check", "wait at most `duration` to see whether the holder is alive (see above)")
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
	b := &breaker{name: name, c: c, pools: pools, backends: backends(pools), stdout: stdout, stderr: stderr,
		keys: keyspace.New(c.prefix, name, true)}
	info, err := b.look(ctx)
	if err != nil && !errors.Is(err, netlock.ErrQuorum) {
		// Inspect validates the name as New does: one rule for every
		// command.
		return cmd.bad("%s", oneLine(err))
	}
	if code, ends := b.endsUnbroken(ctx, info); ends {
		return code
	}
	if !*force {
		again, code, ends := b.checkDead(ctx, info, check)
		if ends {
			return code
		}
		info = again
	}
	run, want := breakTargets(info, !*force)
	return b.breakNodes(ctx, info, run, want)
}

// endsUnbroken reports whether break ends without breaking, from the first
// look at the lock, info: when ctx ended, no node answered, the lock is not
// held as a NetMutex, or a node is one of a Redis Cluster. It says why and
// returns the exit code.
func (b *breaker) endsUnbroken(ctx context.Context, info netlock.Info) (code int, ends bool) {
	b.noteFailures(info)
	if ctx.Err() != nil {
		return exitInterrupted, true
	}
	if len(b.failed) == len(b.c.nodes) {
		return exitUnavailable, true // no node answered: nothing to say on stdout
	}
	if !anyHeld(info) {
		if kind := b.otherKind(ctx); kind != "" {
			fmt.Fprintf(b.stderr, "netlock break: lock %q is held as a %s: break ends NetMutex holds only, and leaves it alone\n", b.name, kind)
			return exitUsage, true
		}
		return b.finish(fmt.Sprintf("lock %q: not held: nothing to break", b.name), nil), true
	}
	if addr := b.clusterNode(ctx); addr != "" {
		fmt.Fprintf(b.stderr, "netlock break: %s is a node of a Redis Cluster: break does not handle a Cluster yet (its waiters listen with sharded pub/sub); nothing was changed\n", addr)
		return exitUsage, true
	}
	return 0, false
}

// checkDead checks, without --force, that the holder of the hold info shows
// is not alive: it refuses a hold it cannot check within check, waits long
// enough to see a live holder extend, and looks again. It returns the
// second look, or reports that break ends there (the holder is alive, the
// key expired, or ctx ended), says why and returns the exit code.
func (b *breaker) checkDead(ctx context.Context, info netlock.Info, check time.Duration) (again netlock.Info, code int, ends bool) {
	if code, refused := b.refuseAtSight(info, check); refused {
		return info, code, true
	}
	wait := aliveWait(info)
	before := time.Now()
	if !sleepCtx(ctx, wait) {
		return info, exitInterrupted, true
	}
	elapsed := time.Since(before)
	again, _ = b.look(ctx)
	if ctx.Err() != nil {
		return again, exitInterrupted, true
	}
	b.noteFailures(again)
	if why := extended(info, again, elapsed); why != "" {
		fmt.Fprintf(b.stderr, "netlock break: lock %q is held by %s, and its holder is alive: %s; --force breaks it anyway\n",
			b.name, heldText(again), why)
		return again, b.exit(exitRefused), true
	}
	if !anyHeld(again) {
		return again, b.finish(fmt.Sprintf("lock %q: not held: its key expired during the %v check; nothing to break", b.name, wait.Round(time.Millisecond)), nil), true
	}
	return again, 0, false
}

// breakTargets returns, for each node of info, whether to run the break
// script on it, and the hold to break there ("" for whatever holds the
// key). Unchecked (--force), it runs on every node that answered, against
// any hold; checked, info is the second look, and it runs only where that
// look saw the key, against the hold it saw.
func breakTargets(info netlock.Info, checked bool) (run []bool, want []string) {
	run = make([]bool, len(info.Nodes))
	want = make([]string, len(info.Nodes))
	for i, n := range info.Nodes {
		run[i] = n.Err == nil
		if checked {
			run[i] = run[i] && n.Held
			want[i] = n.Holder
		}
	}
	return run, want
}

// A breaker is one run of "netlock break": the lock, its nodes, and which of
// them failed so far.
type breaker struct {
	name     string
	c        *conn
	keys     keyspace.Keys
	pools    []*redis.Pool
	backends []netlock.Backend
	failed   map[int]bool // nodes that could not be asked, already said on stderr
	stdout   io.Writer
	stderr   io.Writer
}

// look reads the lock on every node, as netlock status does.
func (b *breaker) look(ctx context.Context) (netlock.Info, error) {
	return netlock.Inspect(ctx, b.name, b.backends, netlock.WithPrefix(b.c.prefix), netlock.WithNodeTimeout(breakTimeout))
}

// noteFailures says on stderr, once per node, why a node of info could not
// be asked.
func (b *breaker) noteFailures(info netlock.Info) {
	for i, n := range info.Nodes {
		if n.Err != nil {
			b.fail(i, n.Err)
		}
	}
}

// fail says on stderr, once per node, why node i could not be asked, in
// status's words: not answering, not a Redis server, or an error reply.
func (b *breaker) fail(i int, err error) {
	if b.failed[i] {
		return
	}
	if b.failed == nil {
		b.failed = map[int]bool{}
	}
	b.failed[i] = true
	why := strings.TrimPrefix(oneLine(err), fmt.Sprintf("node %d: ", i))
	switch {
	case strings.HasPrefix(why, notRedisText):
		why = b.who(i) + " " + why
	case isReply(err):
		why = "Redis at " + b.who(i) + " answered with an error: " + why
	default:
		why = "Redis at " + b.who(i) + " not answering: " + why
	}
	fmt.Fprintf(b.stderr, "netlock break: %s\n", why)
	if h := authHint(err); h != "" {
		fmt.Fprintf(b.stderr, "netlock break: %s\n", h)
	}
}

// who names node i for a message.
func (b *breaker) who(i int) string {
	if len(b.c.nodes) > 1 {
		return fmt.Sprintf("node %d %s", i, b.c.nodes[i].name)
	}
	return b.c.nodes[i].name
}

// exit returns code, or exitUnavailable if a node could not be asked: a
// script learns that break did not see (or do) everything.
func (b *breaker) exit(code int) int {
	if len(b.failed) > 0 {
		return exitUnavailable
	}
	return code
}

// finish prints the summary and the table of results (nil for none), and
// returns the exit code.
func (b *breaker) finish(summary string, rows []string) int {
	if len(b.failed) > 0 {
		summary += fmt.Sprintf(" on the nodes that answered; %d of %d could not be asked (see above), and a key there lasts until its TTL runs out", len(b.failed), len(b.c.nodes))
	}
	fmt.Fprintln(b.stdout, summary)
	if rows != nil {
		tw := tabwriter.NewWriter(b.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tRESULT\tTOKEN\tFENCE COUNTER\tWAITER")
		for _, r := range rows {
			fmt.Fprintln(tw, r)
		}
		tw.Flush()
	}
	return b.exit(exitBroken)
}

// refuseAtSight refuses, without --force, a hold that break cannot tell
// dead by waiting: a value netlock did not write, a key without a TTL, or
// a TTL whose check would take longer than check.
func (b *breaker) refuseAtSight(info netlock.Info, check time.Duration) (int, bool) {
	for i, n := range info.Nodes {
		switch {
		case n.Err != nil || !n.Held:
		case n.Foreign:
			fmt.Fprintf(b.stderr, "netlock break: lock %q: the key on %s holds a value netlock did not write, so no holder of it extends it; --force deletes it\n", b.name, b.who(i))
			return b.exit(exitRefused), true
		case n.TTL < 0:
			fmt.Fprintf(b.stderr, "netlock break: lock %q: the key on %s (fencing token %d) has no TTL, which netlock always sets: it was not written by a NetMutex, or its TTL was removed; --force deletes it\n", b.name, b.who(i), n.Token)
			return b.exit(exitRefused), true
		}
	}
	if wait := aliveWait(info); wait > check {
		fmt.Fprintf(b.stderr, "netlock break: lock %q is held by %s: telling whether its holder is alive takes up to %v (a third of the TTL, the longest a live holder goes between extends, and %v), more than --check %v; give --check %v, or --force to break it anyway\n",
			b.name, heldText(info), wait.Round(time.Millisecond), aliveMargin, check, wait.Round(time.Second)+time.Second)
		return b.exit(exitRefused), true
	}
	return 0, false
}

// aliveWait is how long to wait to see a live holder of info's keys extend:
// a third of the longest TTL (a live NetMutex extends at least every third
// of its expiry, and its key's TTL is never more than its expiry), and
// aliveMargin.
func aliveWait(info netlock.Info) time.Duration {
	var longest time.Duration
	for _, n := range info.Nodes {
		if n.Err == nil && n.Held {
			longest = max(longest, n.TTL)
		}
	}
	return longest/extendsPerExpiry + aliveMargin
}

// extended says how the nodes show a live holder, from a look before and one
// after a wait of elapsed: a key whose TTL went up (an extend), or a key
// that changed hands; "" if they show none.
func extended(before, after netlock.Info, elapsed time.Duration) string {
	for i, a := range after.Nodes {
		b := before.Nodes[i]
		switch {
		case a.Err != nil || b.Err != nil || !a.Held:
		case !b.Held || a.Holder != b.Holder:
			return fmt.Sprintf("the key changed hands in the %v between two reads (now fencing token %d)", elapsed.Round(time.Millisecond), a.Token)
		case a.TTL > b.TTL-elapsed+ttlSlack:
			// Without an extend the TTL would have fallen by at least
			// elapsed: the two reads ran on the node at least that far
			// apart.
			return fmt.Sprintf("the key's TTL went from %v to %v in %v, where without an extend it would have fallen to at most %v",
				b.TTL, a.TTL, elapsed.Round(time.Millisecond), (b.TTL - elapsed).Round(time.Millisecond))
		}
	}
	return ""
}

// anyHeld reports whether a node of info holds the lock's key.
func anyHeld(info netlock.Info) bool {
	for _, n := range info.Nodes {
		if n.Err == nil && n.Held {
			return true
		}
	}
	return false
}

// heldText names the hold of info for a message: "fencing token 7, TTL
// 2.5s", as status words it, where a quorum holds it; otherwise the keys
// left on fewer nodes.
func heldText(info netlock.Info) string {
	if info.Held {
		return holdText(info)
	}
	keyed := 0
	var token uint64
	for _, n := range info.Nodes {
		if n.Err == nil && n.Held {
			keyed++
			token = max(token, n.Token)
		}
	}
	return fmt.Sprintf("keys on %d of %d nodes (fencing token up to %d), short of a quorum", keyed, len(info.Nodes), token)
}

// otherKind returns "NetRWMutex" or "Semaphore" if one of that kind holds
// the lock's name on a node that answers, "" otherwise.
func (b *breaker) otherKind(ctx context.Context) string {
	rw := keyspace.RW(b.c.prefix, b.name, false)
	sem := keyspace.Sem(b.c.prefix, b.name)
	for i, p := range b.pools {
		if b.failed[i] {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, breakTimeout)
		n, err := func() ([]int, error) {
			conn, err := p.GetContext(ctx)
			if err != nil {
				return nil, err
			}
			defer conn.Close()
			conn.Send("EXISTS", rw.Writer, rw.Leases)
			conn.Send("EXISTS", sem.Leases, sem.Permits)
			return redis.Ints(redis.DoContext(conn, ctx, ""))
		}()
		cancel()
		switch {
		case err != nil:
			b.fail(i, err)
		case len(n) == 2 && n[0] > 0:
			return "NetRWMutex"
		case len(n) == 2 && n[1] > 0:
			return "Semaphore"
		}
	}
	return ""
}

// clusterNode returns the address of the first node that says it is a node
// of a Redis Cluster (INFO cluster), or "". A node that cannot be asked, or
// refuses INFO, is taken for a server of its own: the break finds out.
func (b *breaker) clusterNode(ctx context.Context) string {
	for i, p := range b.pools {
		if b.failed[i] {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, breakTimeout)
		info, err := func() (string, error) {
			conn, err := p.GetContext(ctx)
			if err != nil {
				return "", err
			}
			defer conn.Close()
			return redis.String(redis.DoContext(conn, ctx, "INFO", "cluster"))
		}()
		cancel()
		if err == nil && strings.Contains(info, "cluster_enabled:1") {
			return b.c.nodes[i].name
		}
	}
	return ""
}

// A breakResult is what the break script did on one node.
type breakResult struct {
	state   int64 // 1 broken, 0 not held, -1 held by another hold
	token   uint64
	counter uint64
	heard   int64
	skipped int64
	err     error
}

// breakNodes runs the break script, in parallel, on the nodes run says,
// each against the hold want names ("" for any), and reports.
func (b *breaker) breakNodes(ctx context.Context, info netlock.Info, run []bool, want []string) int {
	results := b.runScripts(ctx, run, want)
	var t breakTally
	var rows []string
	for i, r := range results {
		rows = append(rows, b.c.nodes[i].name+"\t"+b.resultRow(i, run[i], info.Nodes[i].Err, r, &t))
	}
	if t.changed > 0 {
		fmt.Fprintf(b.stderr, "netlock break: lock %q changed hands after the check, on %d of %d nodes: another holder took it, and break left it alone; run break again to check the new holder\n", b.name, t.changed, len(run))
	}
	code := b.finish(b.summary(t, len(run), results), rows)
	if t.changed > 0 && code == exitBroken {
		return exitRefused
	}
	return code
}

// runScripts runs the break script, in parallel, on the nodes run says,
// each against the hold want names, and returns what it did on each node
// (the zero breakResult where it did not run).
func (b *breaker) runScripts(ctx context.Context, run []bool, want []string) []breakResult {
	results := make([]breakResult, len(run))
	var wg sync.WaitGroup
	for i := range run {
		if !run[i] {
			continue
		}
		wg.Go(func() {
			results[i] = b.breakNode(ctx, i, want[i])
		})
	}
	wg.Wait()
	return results
}

// breakNode runs the break script on node i against the hold want names
// ("" for any), and returns what it did. A failure, or a reply the script
// does not give, is the result's err.
func (b *breaker) breakNode(ctx context.Context, i int, want string) breakResult {
	ctx, cancel := context.WithTimeout(ctx, breakTimeout)
	defer cancel()
	keys := []string{b.keys.Lock, b.keys.Waiters, b.keys.Fence}
	v, err := b.backends[i].Eval(ctx, breakScript, keys, []string{want, strconv.Itoa(breakWakeTries), b.keys.Channel})
	switch {
	case err != nil:
		return breakResult{err: err}
	case len(v) == 5 && v[0] == 1:
		return breakResult{state: 1, token: uint64(v[1]), counter: uint64(v[2]), heard: v[3], skipped: v[4]}
	case len(v) == 1 && v[0] == 0:
		return breakResult{state: 0}
	case len(v) == 2 && v[0] == -1:
		return breakResult{state: -1, token: uint64(v[1])}
	}
	return breakResult{err: fmt.Errorf("break script: unexpected reply %v", v)}
}

// A breakTally counts what the break script did over the nodes.
type breakTally struct {
	broken  int    // nodes where it broke the hold
	changed int    // nodes where another hold had taken the lock
	token   uint64 // the highest fencing token it broke
}

// resultRow returns the table's cells, after NODE, for node i: r, what the
// script did there if ran, or lookErr, why the node could not be read. It
// says a failure on stderr, and counts r in t.
func (b *breaker) resultRow(i int, ran bool, lookErr error, r breakResult, t *breakTally) string {
	switch {
	case !ran && lookErr != nil, r.err != nil:
		if r.err != nil {
			b.fail(i, r.err)
		}
		return "error\t-\t-\t-"
	case !ran, r.state == 0:
		return "free\t-\t-\t-"
	case r.state == -1:
		t.changed++
		return fmt.Sprintf("changed hands\t%d\t-\t-", r.token)
	}
	t.broken++
	t.token = max(t.token, r.token)
	return fmt.Sprintf("broken\t%d\t%d\t%s", r.token, r.counter, waiterText(r))
}

// summary returns the line that sums up the break over nodes nodes, from t
// and the results.
func (b *breaker) summary(t breakTally, nodes int, results []breakResult) string {
	switch {
	case t.broken == 0 && t.changed == 0:
		return fmt.Sprintf("lock %q: not held: its key went before break ran; nothing to break", b.name)
	case t.broken == 0:
		return fmt.Sprintf("lock %q: not broken", b.name)
	case nodes == 1 && t.token == 0:
		return fmt.Sprintf("lock %q: broken: the hold (it had no fencing token) ended", b.name)
	case nodes == 1:
		return fmt.Sprintf("lock %q: broken: the hold of fencing token %d ended; the fence counter is %d", b.name, t.token, results[0].counter)
	}
	return fmt.Sprintf("lock %q: broken on %d of %d nodes (fencing token up to %d)", b.name, t.broken, nodes, t.token)
}

// waiterText says whom the break told of their turn on one node.
func waiterText(r breakResult) string {
	switch {
	case r.heard > 0 && r.skipped > 0:
		return fmt.Sprintf("told its turn (%d not listening, taken off the queue)", r.skipped)
	case r.heard > 0:
		return "told its turn"
	case r.skipped > 0:
		return fmt.Sprintf("none listening (%d taken off the queue)", r.skipped)
	}
	return "none waiting"
}

// sleepCtx waits d, or until ctx ends: it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
