package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/netlock-go/netlock"
)

// once shows the Once name (what "netlock once" runs under) and returns
// the exit code: held while a run is under way, free otherwise; whether it
// is done is in the output.
func (s *statusRun) once(ctx context.Context) int {
	c := s.c
	o, err := netlock.NewOnce(s.name, s.backends, netlock.WithPrefix(c.prefix), netlock.WithNodeTimeout(statusTimeout))
	if err != nil {
		return s.cmd.bad("%s", oneLine(err))
	}
	info, err := o.Inspect(ctx)
	code := exitFree
	switch {
	case err != nil:
		code = exitUnavailable
	case info.Running.Held:
		code = exitHeld
	}
	if s.asJSON {
		s.printJSON(onceStatusJSON(s.name, c, info, err))
	} else {
		fmt.Fprintf(s.stdout, "once %q: %s\n", s.name, onceSummary(c, info, err))
		tw := tabwriter.NewWriter(s.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tSTATE\tTTL\tTOKEN\tWAITERS\tFENCE COUNTER\tHOLDER")
		for i, n := range info.Running.Nodes {
			fmt.Fprintf(tw, "%s\t%s\n", c.nodes[i].name, row(n))
		}
		tw.Flush()
	}
	nodeWarnings(s.stderr, c, info.Running.Nodes)
	return code
}

// onceSummary says in a few words what Once.Inspect found: done (by which
// run, remembered for how long) or not, and the run under way, if any.
func onceSummary(c *conn, info netlock.OnceInfo, err error) string {
	if err != nil {
		return "unknown: " + c.failure(err)
	}
	s := "not done"
	if info.Done {
		s = "done, " + recordText(info)
	}
	if info.Running.Held {
		s += "; running, " + holdText(info.Running)
	}
	return s
}

// recordText describes the run recorded: `fencing token 3, holder
// "web-1/4242", at 2025-06-01T12:00:00.123Z, remembered until Forget`.
func recordText(info netlock.OnceInfo) string {
	if info.At.IsZero() {
		return "by a record netlock did not write"
	}
	s := "fencing token " + strconv.FormatUint(info.Token, 10)
	if info.HolderInfo != "" {
		s += ", holder " + strconv.Quote(info.HolderInfo)
	}
	s += ", at " + info.At.UTC().Format(time.RFC3339Nano)
	if info.TTL < 0 {
		return s + ", remembered until Forget"
	}
	return s + ", remembered for " + info.TTL.String()
}

// jsonOnceStatus is status --json's output for a Once: its record, and
// its lock as status --json shows a NetMutex's.
type jsonOnceStatus struct {
	Name       string     `json:"name"`
	Kind       string     `json:"kind"`  // once
	State      string     `json:"state"` // done, not done, unknown
	Running    bool       `json:"running"`
	Token      uint64     `json:"token"`                 // the recorded run's
	HolderInfo string     `json:"holder_info,omitempty"` // the recorded run's holder
	At         string     `json:"at,omitempty"`          // when it was recorded, RFC 3339
	TTLMS      int64      `json:"ttl_ms"`                // how long it is remembered still; -1: until Forget
	Lock       jsonStatus `json:"lock"`
	Error      string     `json:"error,omitempty"`
}

func onceStatusJSON(name string, c *conn, info netlock.OnceInfo, err error) jsonOnceStatus {
	s := jsonOnceStatus{Name: name, Kind: statusOnce, State: "not done", Running: info.Running.Held, Lock: statusJSON(name, c, info.Running, err)}
	s.Lock.Kind = statusOnce
	switch {
	case err != nil:
		s.State, s.Error = "unknown", oneLine(err)
	case info.Done:
		s.State, s.Token, s.HolderInfo, s.TTLMS = "done", info.Token, info.HolderInfo, ttlMS(info.TTL)
		if !info.At.IsZero() {
			s.At = info.At.UTC().Format(time.RFC3339Nano)
		}
	}
	return s
}
