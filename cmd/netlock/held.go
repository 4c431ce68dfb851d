package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/netlock-go/netlock"
)

// A held is what "netlock run" holds while its program runs: the hold of a
// lock (a NetMutex), or with --elect the leadership of an election. run
// takes it, supervises it and gives it back the same way for both.
type held interface {
	// take waits until it is ours or ctx ends; with try, it takes it only
	// if it is free now (a lock only: --elect refuses --wait 0). Its errors
	// are LockCtx's, TryLockCtx's (false: errBusy) or Campaign's.
	take(ctx context.Context, try bool) error
	// token is NETLOCK_TOKEN while it is ours: the fencing token, or the
	// term.
	token() uint64
	// lost is closed when it is lost while ours.
	lost() <-chan struct{}
	// release gives it back; an error matching ErrLockLost or
	// ErrNotLeader means it had been lost.
	release(ctx context.Context) error
	// holder says who holds it now, for -v ("fencing token 7, TTL 9.5s"),
	// and whether anybody does.
	holder(ctx context.Context) (who string, held bool, err error)
	// what names it in messages: `the lock "job"`.
	what() string
	// hold names what --max-time ends: `the hold of the lock "job"`.
	hold() string
	// tokenName names token in messages: "fencing token".
	tokenName() string
}

// A lockHold is the hold of the lock NAME.
type lockHold struct {
	m        *netlock.NetMutex
	backends []netlock.Backend
	opts     []netlock.Option // m's, for Inspect
}

func (l *lockHold) take(ctx context.Context, try bool) error {
	if !try {
		return l.m.LockCtx(ctx)
	}
	ok, err := l.m.TryLockCtx(ctx)
	if err == nil && !ok {
		err = errBusy
	}
	return err
}

func (l *lockHold) token() uint64                     { return l.m.Token() }
func (l *lockHold) lost() <-chan struct{}             { return l.m.Lost() }
func (l *lockHold) release(ctx context.Context) error { return l.m.UnlockCtx(ctx) }
func (l *lockHold) what() string                      { return "the lock " + strconv.Quote(l.m.Name()) }
func (l *lockHold) hold() string                      { return "the hold of " + l.what() }
func (l *lockHold) tokenName() string                 { return "fencing token" }

func (l *lockHold) holder(ctx context.Context) (string, bool, error) {
	info, err := netlock.Inspect(ctx, l.m.Name(), l.backends, l.opts...)
	if err != nil || !info.Held {
		return "", false, err
	}
	return holdText(info), true, nil
}

// A leadership is the leadership of the election NAME (run --elect), with
// the value it campaigns with.
type leadership struct {
	e     *netlock.Election
	value string
}

func (l *leadership) take(ctx context.Context, _ bool) error {
	return l.e.Campaign(ctx, l.value)
}

func (l *leadership) token() uint64                     { return l.e.Term() }
func (l *leadership) lost() <-chan struct{}             { return l.e.Lost() }
func (l *leadership) release(ctx context.Context) error { return l.e.Resign(ctx) }
func (l *leadership) what() string                      { return "the leadership of " + strconv.Quote(l.e.Name()) }
func (l *leadership) hold() string                      { return l.what() }
func (l *leadership) tokenName() string                 { return "term" }

func (l *leadership) holder(ctx context.Context) (string, bool, error) {
	leader, err := l.e.Leader(ctx)
	switch {
	case errors.Is(err, netlock.ErrNoLeader):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return fmt.Sprintf("leader %q, term %d", leader.Value, leader.Term), true, nil
}

// defaultValue is what run --elect campaigns with unless --value says:
// "host/pid", which tells the operator where the leader runs.
func defaultValue() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}
