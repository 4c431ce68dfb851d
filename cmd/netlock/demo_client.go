package main

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/gomodule/redigo/redis"
	redisv9 "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/goredis"
)

// backendNames are the client libraries the demo can use, for --backend.
var backendNames = []string{"redigo", "rueidis", "goredis"}

// A client is one simulated process's connection to Redis, through either
// client library: the NetMutex backend and the demo's own counter commands.
type client interface {
	backend() netlock.Backend
	get(ctx context.Context, key string) (int64, error) // 0 when the key is absent
	set(ctx context.Context, key string, v int64) error
	del(ctx context.Context, key string) error
	deleteMatching(ctx context.Context, pattern string) error
	close()
}

// dial connects to server with the named library. A redigo pool keeps up
// to idle connections open between uses.
func dial(lib string, server *node, idle int) (client, error) {
	switch lib {
	case "rueidis":
		c, err := rueidis.NewClient(server.rueidisOption())
		if err != nil {
			return nil, err
		}
		return rueidisClient{c}, nil
	case "goredis":
		// go-redis logs a failed dial itself, on stderr; the demo reports
		// its errors in its own words.
		quietGoRedis.Do(func() { redisv9.SetLogger(discardLogger{}) })
		// idle+1 connections: workers plus the lock's own calls.
		c := redisv9.NewClient(server.goredisOptions(idle + 1))
		// Ping once now, so that an unreachable server is reported at once.
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			return nil, err
		}
		return goredisClient{c}, nil
	default:
		// idle+1: workers plus the lock's own calls, without redialling.
		pool := server.pool(idle+1, redis.DialConnectTimeout(opTimeout))
		// Dial once now, so that an unreachable server is reported at once.
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		conn, err := pool.GetContext(ctx)
		if err == nil {
			_, err = redis.DoContext(conn, ctx, "PING")
			conn.Close()
		}
		if err != nil {
			pool.Close()
			return nil, err
		}
		return redigoClient{pool}, nil
	}
}

type redigoClient struct{ pool *redis.Pool }

func (c redigoClient) backend() netlock.Backend { return netlock.NewRedigo(c.pool) }
func (c redigoClient) close()                   { c.pool.Close() }

func (c redigoClient) do(ctx context.Context, cmd string, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	conn, err := c.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return redis.DoContext(conn, ctx, cmd, args...)
}

func (c redigoClient) get(ctx context.Context, key string) (int64, error) {
	v, err := redis.Int64(c.do(ctx, "GET", key))
	if errors.Is(err, redis.ErrNil) {
		return 0, nil
	}
	return v, err
}

func (c redigoClient) set(ctx context.Context, key string, v int64) error {
	_, err := c.do(ctx, "SET", key, v)
	return err
}

func (c redigoClient) del(ctx context.Context, key string) error {
	_, err := c.do(ctx, "DEL", key)
	return err
}

func (c redigoClient) deleteMatching(ctx context.Context, pattern string) error {
	cursor := "0"
	for {
		reply, err := redis.Values(c.do(ctx, "SCAN", cursor, "MATCH", pattern, "COUNT", 100))
		if err != nil {
			return err
		}
		var keys []string
		if _, err := redis.Scan(reply, &cursor, &keys); err != nil {
			return err
		}
		if len(keys) > 0 {
			if _, err := c.do(ctx, "DEL", redis.Args{}.AddFlat(keys)...); err != nil {
				return err
			}
		}
		if cursor == "0" {
			return nil
		}
	}
}

type rueidisClient struct{ c rueidis.Client }

func (c rueidisClient) backend() netlock.Backend { return netlock.NewRueidis(c.c) }
func (c rueidisClient) close()                   { c.c.Close() }

func (c rueidisClient) get(ctx context.Context, key string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	v, err := c.c.Do(ctx, c.c.B().Get().Key(key).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return v, err
}

func (c rueidisClient) set(ctx context.Context, key string, v int64) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return c.c.Do(ctx, c.c.B().Set().Key(key).Value(strconv.FormatInt(v, 10)).Build()).Error()
}

func (c rueidisClient) del(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return c.c.Do(ctx, c.c.B().Del().Key(key).Build()).Error()
}

func (c rueidisClient) deleteMatching(ctx context.Context, pattern string) error {
	var cursor uint64
	for {
		e, err := c.c.Do(ctx, c.c.B().Scan().Cursor(cursor).Match(pattern).Count(100).Build()).AsScanEntry()
		if err != nil {
			return err
		}
		if len(e.Elements) > 0 {
			if err := c.c.Do(ctx, c.c.B().Del().Key(e.Elements...).Build()).Error(); err != nil {
				return err
			}
		}
		if e.Cursor == 0 {
			return nil
		}
		cursor = e.Cursor
	}
}

// quietGoRedis sets go-redis's logger, which is global, once, before any
// client of go-redis could read it.
var quietGoRedis sync.Once

// discardLogger is a go-redis logger that logs nothing.
type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

type goredisClient struct{ c *redisv9.Client }

func (c goredisClient) backend() netlock.Backend { return goredis.New(c.c) }
func (c goredisClient) close()                   { c.c.Close() }

func (c goredisClient) get(ctx context.Context, key string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	v, err := c.c.Get(ctx, key).Int64()
	if errors.Is(err, redisv9.Nil) {
		return 0, nil
	}
	return v, err
}

func (c goredisClient) set(ctx context.Context, key string, v int64) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return c.c.Set(ctx, key, v, 0).Err()
}

func (c goredisClient) del(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return c.c.Del(ctx, key).Err()
}

func (c goredisClient) deleteMatching(ctx context.Context, pattern string) error {
	var cursor uint64
	for {
		keys, next, err := c.c.Scan(ctx, cursor, pattern, 100).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := c.c.Del(ctx, keys...).Err(); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}
