package fence

import "errors"

// Sentinel errors. Set and Delete wrap one of these, a Backend's error, or
// a context error; their messages name the key. Bad input (a nil Backend,
// an empty key, token 0) is refused before any call to Redis with an error
// that says what is wrong in its message.
var (
	// ErrStale means the token given is below the highest recorded for the
	// key: a later holder of the lock has written since. Nothing was
	// changed. The message names the key, the token given and the one
	// recorded.
	ErrStale = errors.New("fence: stale token")

	// ErrNotFenced means the key holds something other than a fenced value:
	// another Redis type than a hash, or a hash with fields other than
	// ValueField and TokenField, or whose TokenField is not a token. Nothing
	// was changed.
	ErrNotFenced = errors.New("fence: not a fenced value")
)
