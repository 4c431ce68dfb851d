package fence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/netlock-go/netlock"
)

// The fields of a fenced key, a Redis hash. Read a fenced value with any
// client as HGET key v; its token is HGET key t. A key that has seen a
// fenced delete keeps only TokenField.
const (
	ValueField = "v" // the value written by the last Set
	TokenField = "t" // the highest token written, in decimal
)

var (
	//go:embed lua/record.lua
	recordLua string
	//go:embed lua/set.lua
	setLua string
	//go:embed lua/delete.lua
	deleteLua string

	// header gives the Lua the names it shares with Go, defined once here.
	header = fmt.Sprintf("local valueField, tokenField, maxToken = %q, %q, %q\n",
		ValueField, TokenField, strconv.FormatUint(math.MaxUint64, 10))

	setScript    = netlock.NewScript("fence_set", header+recordLua+setLua)
	deleteScript = netlock.NewScript("fence_delete", header+recordLua+deleteLua)
)

// Reply codes of set.lua and delete.lua.
const (
	replyDone      = 1
	replyStale     = 0  // followed by the recorded token: high, low
	replyOtherType = -1 // not a hash
	replyOtherHash = -2 // a hash, not a fenced value
)

// tokenLow is what the scripts split a token by, so that each part is exact
// as a Lua number (a double) and as a reply: token = high*tokenLow + low,
// low the last nine decimal digits (see lua/record.lua).
const tokenLow = 1_000_000_000

// errZeroToken is the message of a token of 0: the value NetMutex.Token
// returns when no hold is current, never a hold's token.
const errZeroToken = "token 0 (tokens start at 1; a NetMutex's Token is 0 when it is not locked or fencing is off)"

// check refuses bad input before any call to Redis.
func check(op string, b netlock.Backend, key string, token uint64) error {
	switch {
	case b == nil:
		return fmt.Errorf("fence: %s %q: nil Backend", op, key)
	case key == "":
		return fmt.Errorf("fence: %s: empty key", op)
	case token == 0:
		return fmt.Errorf("fence: %s %q: %s", op, key, errZeroToken)
	}
	return nil
}

// run checks its input, runs s, of operation op (set, delete), on key with
// token and then args, and turns its reply into an error.
func run(ctx context.Context, op string, s *netlock.Script, b netlock.Backend, key string, token uint64, args ...string) error {
	if err := check(op, b, key, token); err != nil {
		return err
	}
	argv := append([]string{strconv.FormatUint(token, 10)}, args...)
	reply, err := b.Eval(ctx, s, []string{key}, argv)
	if err != nil {
		return fmt.Errorf("fence: %s %q: %w", op, key, err)
	}
	switch {
	case len(reply) == 1 && reply[0] == replyDone:
		return nil
	case len(reply) == 3 && reply[0] == replyStale:
		// The script bounds the recorded token by MaxUint64: high is at
		// most 18446744073, so this does not overflow.
		recorded := uint64(reply[1])*tokenLow + uint64(reply[2])
		return fmt.Errorf("%w: %s %q with token %d: token %d is recorded; nothing changed",
			ErrStale, op, key, token, recorded)
	case len(reply) == 1 && reply[0] == replyOtherType:
		return fmt.Errorf("%w: %s %q: the key holds another Redis type than a hash; nothing changed",
			ErrNotFenced, op, key)
	case len(reply) == 1 && reply[0] == replyOtherHash:
		return fmt.Errorf("%w: %s %q: the key holds a hash with fields other than %q and %q, or whose %q is not a token; nothing changed",
			ErrNotFenced, op, key, ValueField, TokenField, TokenField)
	}
	return fmt.Errorf("fence: %s %q: %w: %v", op, key, errReply, reply)
}

// errReply is a reply the scripts never give: another script loaded under
// the same SHA1, or a Backend that does not return Eval's reply.
var errReply = errors.New("unexpected script reply")
