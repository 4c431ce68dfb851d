package main

import (
	"errors"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// How the commands word what went wrong with Redis.

// oneLine renders err for a message: the lines of a multi-line error
// (errors.Join) joined with "; ", without the library's "netlock: "
// prefixes, which would double the command's own.
func oneLine(err error) string {
	s := strings.ReplaceAll(err.Error(), "\n", "; ")
	s = strings.TrimPrefix(s, "netlock: ")
	return strings.ReplaceAll(s, "; netlock: ", "; ")
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
// answering" (it could not be reached or timed out) or "answered with an
// error" (an error reply: NOAUTH, WRONGTYPE, ...); a quorum's error names each node that failed, and how.
func (c *conn) failure(err error) string {
	s := c.errText(err)
	if len(c.nodes) > 1 {
		return "Redis at " + c.where() + ": " + s
	}
	name := c.nodes[0].name
	switch {
	case isReply(err):
		return "Redis at " + name + " answered with an error: " + s
	}
	return "Redis at " + name + " not answering: " + s
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
