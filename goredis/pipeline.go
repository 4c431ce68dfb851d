package goredis

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
)

// A pipeline sends the script calls of a Backend on a *redis.Client that
// come while another of its calls is in flight together, in one go-redis
// pipeline (Client.Pipelined): one connection, one write and one read for
// the lot, where each call on a connection of its own costs the client and
// the server a write and a read. The calls of 64 goroutines locking keys of
// their own then take a few connections instead of the pool's, as
// rueidis's calls (which pipeline every call) and the redigo Backend's do.
//
// A call alone, the usual case, runs at once, as a plain EVALSHA of the
// client's pool. A call that finds one in flight queues; one goroutine at a
// time sends the queue as one pipeline, and again while calls queued
// meanwhile. A call returns its context's error as soon as its context
// ends; its command is sent and its reply dropped. A pipeline is bounded by
// the latest deadline of its calls (every call of netlock has one, the node
// timeout) and by the client's own timeouts.
type pipeline struct {
	c    *redis.Client
	eval func(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error)
	cmd  func(ctx context.Context, s *netlock.Script, source bool, keys, args []string) *redis.IntSliceCmd

	mu       sync.Mutex
	inFlight int          // calls sent alone and not yet answered
	queue    []*pipedCall // waiting for the next pipeline
	sending  bool         // a goroutine sends the queue
}

// A pipedCall is one script call waiting in a pipeline's queue.
type pipedCall struct {
	ctx  context.Context
	s    *netlock.Script
	keys []string
	args []string
	done chan pipedReply // buffered: the sender never waits for the caller
}

type pipedReply struct {
	reply []int64
	err   error
}

// run runs s: alone if no other call is in flight, else in the next
// pipeline.
func (p *pipeline) run(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	p.mu.Lock()
	if p.inFlight == 0 && !p.sending {
		p.inFlight++
		p.mu.Unlock()
		reply, err := p.eval(ctx, s, keys, args)
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
		return reply, err
	}
	c := &pipedCall{ctx: ctx, s: s, keys: keys, args: args, done: make(chan pipedReply, 1)}
	p.queue = append(p.queue, c)
	if !p.sending {
		p.sending = true
		go p.send()
	}
	p.mu.Unlock()
	select {
	case r := <-c.done:
		return r.reply, ended(ctx, r.err)
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// send sends the queue as one pipeline, and again while calls queued
// meanwhile; then it stops.
func (p *pipeline) send() {
	for {
		p.mu.Lock()
		calls := p.queue
		p.queue = nil
		if len(calls) == 0 {
			p.sending = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		p.sendAll(calls)
	}
}

// sendAll runs calls in one pipeline of EVALSHAs, and the ones the server
// answered NOSCRIPT again in one of EVALs, and hands each call its reply.
func (p *pipeline) sendAll(calls []*pipedCall) {
	ctx, cancel := latestDeadline(calls)
	defer cancel()
	cmds := p.pipe(ctx, calls, false)
	var again []*pipedCall
	var at []int
	for i, cmd := range cmds {
		if noScript(cmd.Err()) {
			again = append(again, calls[i])
			at = append(at, i)
		}
	}
	if len(again) > 0 {
		for j, cmd := range p.pipe(ctx, again, true) {
			cmds[at[j]] = cmd
		}
	}
	for i, c := range calls {
		reply, err := cmds[i].Result()
		c.done <- pipedReply{reply, ended(c.ctx, err)}
	}
}

// pipe sends calls in one pipeline, with EVALSHA, or with EVAL and the
// scripts' source, and returns their commands, answered or failed.
func (p *pipeline) pipe(ctx context.Context, calls []*pipedCall, source bool) []*redis.IntSliceCmd {
	cmds := make([]*redis.IntSliceCmd, len(calls))
	_, err := p.c.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = p.cmd(ctx, c.s, source, c.keys, c.args)
			_ = pl.Process(ctx, cmds[i])
		}
		return nil
	})
	for _, cmd := range cmds {
		unanswered(cmd, err)
	}
	return cmds
}

// unanswered gives cmd, a command of a pipeline that failed with err, err
// as its own if it has neither an error nor a reply. The pipeline's error is
// its first failed command's, and each command's is read instead; but
// go-redis before v9.23 leaves the commands of a pipeline without an error
// when its last retry fails to connect (a server down: dial refused), and
// an IntSliceCmd then reads as an empty reply and no error.
func unanswered(cmd *redis.IntSliceCmd, err error) {
	if err != nil && cmd.Err() == nil && len(cmd.Val()) == 0 {
		cmd.SetErr(err)
	}
}

// latestDeadline returns a context, detached from the calls' cancellation
// (a caller that gives up must not cut the others' replies short), with the
// latest of their deadlines; none if one of them has none.
func latestDeadline(calls []*pipedCall) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		dl, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(c.ctx))
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(context.WithoutCancel(calls[0].ctx), latest)
}
