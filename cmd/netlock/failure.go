package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock"
)

// How the commands word what went wrong with Redis.

// notRedisText is what the commands say of a node that answers, but not in
// the Redis protocol: something else listens at its address.
const notRedisText = "does not answer as a Redis server"

// notRedis matches the client libraries' errors for a reply that is not the
// Redis protocol (redigo's, which blames the server or the application,
// rueidis's, go-redis's), up to the next "; " of a joined error. Group 1 is
// what is kept of it: the library's word on the first bytes it read.
var notRedis = regexp.MustCompile(`redigo: ([^;]*?) \(possible server error or unsupported concurrent read by application\)|(received unknown message type: [^;]*)|(redis: (?:can't parse|invalid reply)[^;]*)`)

// protocolText rewrites, in the error text s, every error of a client
// library that read something other than the Redis protocol as
// notRedisText, with the library's word in parentheses.
func protocolText(s string) string {
	return notRedis.ReplaceAllStringFunc(s, func(m string) string {
		g := notRedis.FindStringSubmatch(m)
		switch {
		case g[1] != "":
			return notRedisText + " (redigo: " + g[1] + ")"
		case g[2] != "":
			return notRedisText + " (rueidis: " + g[2] + ")"
		}
		return notRedisText + " (go-redis: " + strings.TrimPrefix(g[3], "redis: ") + ")"
	})
}

// checkProtocol sends a PING to each of c's nodes through its pool, all at
// once, each within timeout, and returns what to say if so many of them
// answer in something other than the Redis protocol that a quorum cannot
// be had; "" otherwise. Waiting for the lock would ride such answers out
// as an outage (netlock retries all but an error reply), though no retry
// makes a server Redis. Nodes that do not answer at all are left to the
// wait, as is any other error.
func (c *conn) checkProtocol(ctx context.Context, pools []*redis.Pool, timeout time.Duration) string {
	errs := make([]error, len(pools))
	var wg sync.WaitGroup
	for i, p := range pools {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			conn, err := p.GetContext(ctx)
			if err == nil {
				_, err = redis.DoContext(conn, ctx, "PING")
				conn.Close() // back to the pool, for the lock
			}
			errs[i] = err
		})
	}
	wg.Wait()
	var bad []string
	for i, err := range errs {
		if err != nil && notRedis.MatchString(err.Error()) {
			bad = append(bad, fmt.Sprintf("node %d %s %s", i, c.nodes[i].name, protocolText(err.Error())))
		}
	}
	quorum := len(pools)/2 + 1
	switch {
	case len(pools)-len(bad) >= quorum:
		return ""
	case len(pools) == 1:
		return c.failure(errs[0])
	}
	return fmt.Sprintf("%d of %d nodes do not answer as Redis servers, and a quorum is %d: %s", len(bad), len(pools), quorum, strings.Join(bad, "; "))
}

// oneLine renders err for a message: the lines of a multi-line error
// (errors.Join) joined with "; ", without the library's "netlock: "
// prefixes, which would double the command's own, and with a node that is
// not a Redis server said to be so (protocolText).
func oneLine(err error) string { return oneLineText(err.Error()) }

// oneLineText is oneLine for an error's text s.
func oneLineText(s string) string {
	s = strings.ReplaceAll(s, "\n", "; ")
	s = strings.TrimPrefix(s, "netlock: ")
	return protocolText(strings.ReplaceAll(s, "; netlock: ", "; "))
}

// errText renders err, about c's nodes, for a message: oneLine, without the
// "node 0: " of a single node, which the message names already.
func (c *conn) errText(err error) string {
	s := oneLine(err)
	if len(c.nodes) == 1 {
		s = strings.TrimPrefix(s, "node 0: ")
	}
	return s
}

// failure says why the lock could not be asked for or about on c's nodes,
// naming them: err is what the library returned, matching
// netlock.ErrQuorum, without the context's error. A single node is "not
// answering" (it could not be reached or timed out), "does not answer as a
// Redis server", or "answered with an error" (an error reply: NOAUTH,
// WRONGTYPE, ...); a quorum's error names each node that failed, and how.
func (c *conn) failure(err error) string {
	s := c.errText(quorumPart(err))
	if len(c.nodes) > 1 {
		return "Redis at " + c.where() + ": " + s
	}
	name := c.nodes[0].name
	switch {
	case strings.HasPrefix(s, notRedisText):
		return name + " " + s
	case isReply(err):
		return "Redis at " + name + " answered with an error: " + s
	}
	return "Redis at " + name + " not answering: " + s
}

// quorumPart returns, of an error that joins the context's (a wait that
// ran out while an attempt was on its way) to the nodes' (matching
// netlock.ErrQuorum), the nodes' part; otherwise err.
func quorumPart(err error) error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok || errors.Is(err, netlock.ErrNotObtained) {
		return err
	}
	var nodes []error
	for _, e := range joined.Unwrap() {
		if errors.Is(e, netlock.ErrQuorum) {
			nodes = append(nodes, e)
		}
	}
	if len(nodes) != 1 || nodes[0] == netlock.ErrQuorum {
		return err // err is the nodes' error itself
	}
	return nodes[0]
}

// isReply reports whether err is, or wraps, an error reply of a server
// (redigo's redis.Error), which retrying does not change.
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// withoutCause is err without cause, the error of the context that ended
// the call: the library joins the two (errors.Join's Unwrap() []error) when
// a wait ends while Redis does not answer, and the message then says what
// the nodes did, and the caller why it stopped waiting.
func withoutCause(err, cause error) error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok || cause == nil {
		return err
	}
	var rest []error
	for _, e := range j.Unwrap() {
		if e != cause {
			rest = append(rest, e)
		}
	}
	switch len(rest) {
	case len(j.Unwrap()):
		return err
	case 1:
		return rest[0]
	}
	return errors.Join(rest...)
}

// authHint returns advice for a node's error that is about credentials, ""
// for any other.
func authHint(err error) string {
	switch s := err.Error(); {
	case strings.Contains(s, "NOAUTH"):
		return "the server wants a password: put it in $" + envPassword + " (with --user for an ACL user), or in a redis:// URL"
	case strings.Contains(s, "WRONGPASS"):
		return "the server refused the user or password ($" + envPassword + ", --user, or the redis:// URL)"
	case strings.Contains(s, "NOPERM"):
		return "the user lacks a permission netlock needs: EVALSHA and EVAL, the commands its scripts run, SUBSCRIBE, and the lock's keys and channels"
	}
	return ""
}
