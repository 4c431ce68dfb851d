package netlock

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"weak"
)

// A Client makes locks on one set of backends with one set of options,
// given once: c.Mutex("balance:"+id) in place of
// New("balance:"+id, backends, opts...).
//
// Goroutines of a process that ask one Client for the same name get the
// same lock object while any of them still uses it, so they queue and hand
// the hold on to one another locally, as goroutines sharing a NetMutex do
// (WithLocalHandoffs), instead of each asking Redis. A lock object nobody
// refers to any more is forgotten, so a Client that locks millions of
// distinct names keeps only those in use in memory.
//
// A Client is safe for concurrent use by many goroutines. It must be
// created with NewClient.
type Client struct {
	backends []Backend
	opts     []Option

	mu      sync.Mutex
	mutexes map[string]weak.Pointer[NetMutex]
	rws     map[string]weak.Pointer[NetRWMutex]
	sems    map[semName]weak.Pointer[Semaphore]
	onces   map[string]weak.Pointer[Once]
}

// semName is a semaphore's name and size: Semaphores of one name but
// different sizes are not shared (their calls fail with ErrSizeMismatch).
type semName struct {
	name string
	size int64
}

// NewClient returns a Client for backends (one backend, or the independent
// deployments of a quorum, as New takes them) with opts, the options every
// lock it makes starts from. It validates both as New does, and does not
// contact Redis.
func NewClient(backends []Backend, opts ...Option) (*Client, error) {
	if err := checkNew("client", backends); err != nil {
		return nil, err
	}
	if _, err := newConfig(opts); err != nil {
		return nil, err
	}
	return &Client{
		backends: append([]Backend(nil), backends...),
		opts:     append([]Option(nil), opts...),
		mutexes:  map[string]weak.Pointer[NetMutex]{},
		rws:      map[string]weak.Pointer[NetRWMutex]{},
		sems:     map[semName]weak.Pointer[Semaphore]{},
		onces:    map[string]weak.Pointer[Once]{},
	}, nil
}

// Mutex returns the NetMutex of name on c's backends, with c's options. It
// returns the lock object a goroutine of this process got for name and
// still uses, if any, so that they share it; otherwise a new one. With
// opts (added to c's), it returns a NetMutex of its own, not shared. Its
// errors are New's.
func (c *Client) Mutex(name string, opts ...Option) (*NetMutex, error) {
	if len(opts) > 0 {
		return New(name, c.backends, c.options(opts)...)
	}
	return shared(c, c.mutexes, name, func() (*NetMutex, error) { return New(name, c.backends, c.opts...) })
}

// RWMutex returns the NetRWMutex of name on c's backends, with c's options,
// shared as Mutex shares a NetMutex. Its errors are NewRW's.
func (c *Client) RWMutex(name string, opts ...Option) (*NetRWMutex, error) {
	if len(opts) > 0 {
		return NewRW(name, c.backends, c.options(opts)...)
	}
	return shared(c, c.rws, name, func() (*NetRWMutex, error) { return NewRW(name, c.backends, c.opts...) })
}

// Semaphore returns the Semaphore of name and size on c's backends, with
// c's options, shared as Mutex shares a NetMutex (by name and size). Its
// errors are NewSemaphore's.
func (c *Client) Semaphore(name string, size int64, opts ...Option) (*Semaphore, error) {
	if len(opts) > 0 {
		return NewSemaphore(name, size, c.backends, c.options(opts)...)
	}
	return shared(c, c.sems, semName{name, size}, func() (*Semaphore, error) { return NewSemaphore(name, size, c.backends, c.opts...) })
}

// Inspect reads the state of the lock name in Redis, as Inspect does, on
// c's backends with c's options.
func (c *Client) Inspect(ctx context.Context, name string) (Info, error) {
	if c == nil || c.mutexes == nil {
		return Info{}, errZeroClient
	}
	return Inspect(ctx, name, c.backends, c.opts...)
}

// errZeroClient is returned by a Client not made by NewClient.
var errZeroClient = fmt.Errorf("netlock: Client not created by NewClient (the zero value is not usable)")

// options returns c's options followed by opts.
func (c *Client) options(opts []Option) []Option {
	return append(append([]Option(nil), c.opts...), opts...)
}

// shared returns the lock object of key in m while anyone still refers to
// it, or one made now. m holds weak pointers: an object nobody refers to is
// collected, and its entry deleted then (unless a new object took its key).
func shared[K comparable, T any](c *Client, m map[K]weak.Pointer[T], key K, make func() (*T, error)) (*T, error) {
	if c == nil || c.mutexes == nil {
		return nil, errZeroClient
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := m[key].Value(); v != nil {
		return v, nil
	}
	v, err := make()
	if err != nil {
		return nil, err
	}
	p := weak.Make(v)
	m[key] = p
	// The cleanup refers to p, a weak pointer, not to v: v stays
	// collectable.
	runtime.AddCleanup(v, func(key K) {
		c.mu.Lock()
		if m[key] == p {
			delete(m, key)
		}
		c.mu.Unlock()
	}, key)
	return v, nil
}
