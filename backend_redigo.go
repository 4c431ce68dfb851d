package netlock

import (
	"context"
	"errors"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// NewRedigo returns a Backend that runs scripts on connections from pool.
// The pool is the caller's to configure and close. Each call takes a
// connection with pool.GetContext and returns it when done.
func NewRedigo(pool *redis.Pool) Backend {
	if pool == nil {
		return nil // New names the nil backend
	}
	return &redigoBackend{pool: pool}
}

type redigoBackend struct {
	pool *redis.Pool
}

func (b *redigoBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	conn, err := b.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()

	argv := make([]any, 0, 2+len(keys)+len(args))
	argv = append(argv, s.SHA1(), len(keys))
	for _, k := range keys {
		argv = append(argv, k)
	}
	for _, a := range args {
		argv = append(argv, a)
	}
	reply, err := redis.Int64s(redis.DoContext(conn, ctx, "EVALSHA", argv...))
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		argv[0] = s.Source()
		reply, err = redis.Int64s(redis.DoContext(conn, ctx, "EVAL", argv...))
	}
	return reply, err
}

// finalErr reports whether err is an error reply of the server or means the
// pool was closed.
func (b *redigoBackend) finalErr(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) || strings.Contains(err.Error(), "get on closed pool")
}
