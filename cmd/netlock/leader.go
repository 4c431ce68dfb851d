package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/netlock-go/netlock"
)

const leaderHelp = `Usage: netlock leader [flags] NAME

Shows who leads the election NAME (a netlock.Election): the value the
leader campaigned with or last proclaimed, and its term, the fencing token
that grows with every new leader. Over several nodes, what a majority of
them holds. It changes nothing in Redis.

--watch prints the leader now, then every change (a new leader, a new
value, nobody leading once a leader resigned or its hold expired), one line
each, until interrupted.

Exit status: 0 a leader leads (with --watch: interrupted), 1 nobody leads,
64 bad usage, 69 too few nodes answered to tell.

` + connHelp + `
Flags:
`

// runLeader runs "netlock leader" with args (the arguments after "leader")
// and returns the exit code.
func runLeader(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newSubcommand("leader", leaderHelp, stdout, stderr)
	watch := cmd.fs.Bool("watch", false, "print every change until interrupted")
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
	e, err := netlock.NewElection(name, backends(pools), netlock.WithPrefix(c.prefix), netlock.WithNodeTimeout(statusTimeout))
	if err != nil {
		return cmd.bad("%s", oneLine(err)) // the name, checked as NewElection does
	}
	l, err := e.Leader(ctx)
	switch {
	case errors.Is(err, netlock.ErrNoLeader):
		code = exitNoLeader
	case err != nil:
		fmt.Fprintf(stderr, "netlock leader: %s\n", c.failure(err))
		return exitUnavailable
	default:
		code = exitOK
	}
	if !*watch {
		fmt.Fprintln(stdout, leaderLine(name, l))
		return code
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	for l := range e.Observe(ctx) {
		fmt.Fprintln(stdout, leaderLine(name, l))
	}
	return exitOK
}

// leaderLine says who leads: `election "jobs": leader "10.0.0.1", term 7`,
// or `election "jobs": no leader`.
func leaderLine(name string, l netlock.Leader) string {
	if l == (netlock.Leader{}) {
		return fmt.Sprintf("election %q: no leader", name)
	}
	return fmt.Sprintf("election %q: leader %q, term %s", name, l.Value, strconv.FormatUint(l.Term, 10))
}
