package netlock

import (
	"context"
	"errors"

	"github.com/redis/rueidis"
)

// NewRueidis returns a Backend that runs scripts on client: a single-server,
// sentinel or cluster client. In a cluster, all keys of one lock share a hash
// slot, so scripts are routed to one node and never fail with CROSSSLOT. The
// client is the caller's to close.
func NewRueidis(client rueidis.Client) Backend {
	if client == nil {
		return nil // New names the nil backend
	}
	return &rueidisBackend{client: client}
}

type rueidisBackend struct {
	client rueidis.Client
}

func (b *rueidisBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	c := b.client
	reply, err := c.Do(ctx, c.B().Evalsha().Sha1(s.SHA1()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	if rerr, ok := rueidis.IsRedisErr(err); ok && rerr.IsNoScript() {
		reply, err = c.Do(ctx, c.B().Eval().Script(s.Source()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	}
	return reply, err
}

// finalErr reports whether err is an error reply of the server or means the
// client was closed.
func (b *rueidisBackend) finalErr(err error) bool {
	_, reply := rueidis.IsRedisErr(err)
	return reply || errors.Is(err, rueidis.ErrClosing)
}
