package netlock

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strings"
)

// A Backend is one independent Redis deployment: a single server, a primary
// with replicas, or a Redis Cluster. A NetMutex over one Backend is a plain
// lock; over several it is a quorum lock.
//
// Implementations must be safe for concurrent use. NewRedigo, NewRueidis
// and package netlock/goredis are the ones netlock provides. Another client
// library needs only this one method to lock correctly; with it alone, its
// waiters poll. Implementing the optional interfaces as well, Subscriber
// (waiting by message, in a queue) and ErrorClassifier (telling final
// errors), makes it wait and recover as the built-in Backends do;
// ReplicaWaiter makes it usable with WithSyncReplicas.
type Backend interface {
	// Eval runs s with EVALSHA, falling back to EVAL when the server answers
	// NOSCRIPT, and returns its reply: every netlock script returns an array
	// of integers. It returns ctx's error if ctx ends first.
	Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error)
}

// A Script is one of netlock's Lua scripts, with its SHA1 computed once.
type Script struct {
	name, src, sha string
	// shaArg is sha as an interface value, made once: a client library
	// that takes its arguments as []any (redigo) would box it per call.
	shaArg any
	op     scriptOp
	// sharded is the variant of a script that tells waiters (see
	// lua/handon.lua) that does so with SPUBLISH, run on a Backend whose
	// Hub uses sharded pub/sub (see engine.call); nil for the others.
	sharded *Script
}

// A scriptOp is what a script does to a hold, whichever lock it is for:
// call and the limiter treat acquires and extends apart, and a server out
// of memory refuses a release only for a moment (see transientReply).
type scriptOp int

const (
	opOther scriptOp = iota
	opAcquire
	opExtend
	opRelease // gives back what a hold or a waiter had: a release or a leave
)

// NewScript returns a Script of Lua source src, named name in errors, to
// run through a Backend's Eval like netlock's own: its reply must be an
// array of integers. Packages built on netlock (see package fence) use it to
// run scripts of their own on every client a Backend adapts.
func NewScript(name, src string) *Script { return newScript(name, src) }

func newScript(name, src string) *Script {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	return &Script{name: name, src: src, sha: sha, shaArg: sha}
}

// withOp sets s's op and returns s.
func (s *Script) withOp(op scriptOp) *Script {
	s.op = op
	if s.sharded != nil {
		s.sharded.op = op
	}
	return s
}

// newTelling returns the script name, whose source src tells waiters with
// handOn: the variant that publishes with PUBLISH, whose sharded variant
// publishes with SPUBLISH. One source, two SHA1s: the command is set by a
// first line, not passed by the caller, and noPublish (lua/nopublish.lua)
// follows it.
func newTelling(name, src string) *Script {
	s := newScript(name, "local publish = 'PUBLISH'\n"+noPublishLua+src)
	s.sharded = newScript(name, "local publish = 'SPUBLISH'\n"+noPublishLua+src)
	return s
}

// handOnHere is the line of a script after which handOn (lua/handon.lua)
// is defined, where it is not prepended: after a common path that needs
// none. Each EVALSHA runs the whole chunk, and a function defined there is
// a new closure every time.
const handOnHere = "-- handOn (handon.lua) is defined here.\n"

// withHandOn returns src with handOn defined after its handOnHere line.
func withHandOn(src string) string {
	before, after, ok := strings.Cut(src, handOnHere)
	if !ok {
		panic("netlock: a script has no line " + handOnHere)
	}
	return before + handOnHere + handOnLua + after
}

// Name returns the script's name, such as "acquire".
func (s *Script) Name() string { return s.name }

// Source returns the Lua source, for EVAL.
func (s *Script) Source() string { return s.src }

// SHA1 returns the hex SHA1 of the source, for EVALSHA.
func (s *Script) SHA1() string { return s.sha }

var (
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/extend.lua
	extendLua string
	//go:embed lua/leave.lua
	leaveLua string
	// handOn, the function that gives a turn on, is shared by release,
	// leave and the multi_ scripts: one definition, prepended to them, or
	// put where release says (withHandOn).
	//go:embed lua/handon.lua
	handOnLua string
	// noPublish, which tells a script whether this user may publish on a
	// channel, is put before every script that tells (see newTelling).
	//go:embed lua/nopublish.lua
	noPublishLua string
	//go:embed lua/channels.lua
	channelsLua string
	//go:embed lua/inspect.lua
	inspectLua string
	// readstate's functions, which read a lock key and the server's memory
	// policy, are shared by inspect and rw_inspect: one definition,
	// prepended to both.
	//go:embed lua/readstate.lua
	readStateLua string
	// pack, which puts a string in a reply of integers, is shared by the
	// scripts that read (inspect, rw_inspect, sem_inspect, elect_read,
	// once_inspect): one definition, prepended to each.
	//go:embed lua/pack.lua
	packLua string

	//go:embed lua/elect_proclaim.lua
	electProclaimLua string
	//go:embed lua/elect_read.lua
	electReadLua string

	//go:embed lua/rw_acquire.lua
	rwAcquireLua string
	//go:embed lua/rw_release.lua
	rwReleaseLua string
	//go:embed lua/rw_extend.lua
	rwExtendLua string
	//go:embed lua/rw_leave.lua
	rwLeaveLua string
	//go:embed lua/rw_wake.lua
	rwWakeLua string
	//go:embed lua/rw_inspect.lua
	rwInspectLua string

	//go:embed lua/multi_acquire.lua
	multiAcquireLua string
	//go:embed lua/multi_release.lua
	multiReleaseLua string
	//go:embed lua/multi_extend.lua
	multiExtendLua string
	//go:embed lua/multi_leave.lua
	multiLeaveLua string

	//go:embed lua/sem_acquire.lua
	semAcquireLua string
	//go:embed lua/sem_release.lua
	semReleaseLua string
	//go:embed lua/sem_extend.lua
	semExtendLua string
	//go:embed lua/sem_leave.lua
	semLeaveLua string
	//go:embed lua/sem_wake.lua
	semWakeLua string
	//go:embed lua/sem_inspect.lua
	semInspectLua string

	//go:embed lua/once_read.lua
	onceReadLua string
	//go:embed lua/once_record.lua
	onceRecordLua string
	//go:embed lua/once_forget.lua
	onceForgetLua string
	//go:embed lua/once_inspect.lua
	onceInspectLua string

	acquireScript = newScript("acquire", acquireLua).withOp(opAcquire)
	releaseScript = newTelling("release", withHandOn(releaseLua)).withOp(opRelease)
	extendScript  = newScript("extend", extendLua).withOp(opExtend)
	leaveScript   = newTelling("leave", handOnLua+leaveLua).withOp(opRelease)
	inspectScript = newScript("inspect", packLua+readStateLua+inspectLua)
	// The ACL check of a lock's channels (see acl.go).
	channelsScript = newTelling("channels", channelsLua)

	// Election's (see election.go).
	electProclaimScript = newTelling("elect_proclaim", electProclaimLua)
	electReadScript     = newScript("elect_read", packLua+electReadLua)

	// NetRWMutex's (see rwmutex.go).
	rwAcquireScript = newTelling("rw_acquire", rwAcquireLua).withOp(opAcquire)
	rwReleaseScript = newTelling("rw_release", rwWakeLua+rwReleaseLua).withOp(opRelease)
	rwExtendScript  = newScript("rw_extend", rwExtendLua).withOp(opExtend)
	rwLeaveScript   = newTelling("rw_leave", rwWakeLua+rwLeaveLua).withOp(opRelease)
	rwInspectScript = newScript("rw_inspect", packLua+readStateLua+rwInspectLua)

	// MultiMutex's (see multi.go).
	multiAcquireScript = newTelling("multi_acquire", handOnLua+multiAcquireLua).withOp(opAcquire)
	multiReleaseScript = newTelling("multi_release", handOnLua+multiReleaseLua).withOp(opRelease)
	multiExtendScript  = newScript("multi_extend", multiExtendLua).withOp(opExtend)
	multiLeaveScript   = newTelling("multi_leave", handOnLua+multiLeaveLua).withOp(opRelease)

	// Semaphore's (see semaphore.go).
	semAcquireScript = newTelling("sem_acquire", semWakeLua+semAcquireLua).withOp(opAcquire)
	semReleaseScript = newTelling("sem_release", semWakeLua+semReleaseLua).withOp(opRelease)
	semExtendScript  = newTelling("sem_extend", semWakeLua+semExtendLua).withOp(opExtend)
	semLeaveScript   = newTelling("sem_leave", semWakeLua+semLeaveLua).withOp(opRelease)
	semInspectScript = newScript("sem_inspect", packLua+semInspectLua)

	// Once's (see once.go).
	onceReadScript    = newScript("once_read", onceReadLua)
	onceRecordScript  = newScript("once_record", onceRecordLua)
	onceForgetScript  = newScript("once_forget", onceForgetLua)
	onceInspectScript = newScript("once_inspect", packLua+onceInspectLua)
)
