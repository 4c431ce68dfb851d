package netlock_test

import (
	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/goredis"
)

// The tests of package netlock run on go-redis too, through netlock/goredis,
// which they cannot import themselves (it imports netlock): see
// RegisterTestClient in export_test.go.
func init() {
	netlock.RegisterTestClient("goredis", func(c netlock.TestClientConfig) (netlock.Backend, func(), error) {
		if len(c.Cluster) > 0 {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Cluster, ContextTimeoutEnabled: true})
			return goredis.New(rdb), func() { rdb.Close() }, nil
		}
		rdb := redis.NewClient(&redis.Options{
			Addr:     c.Addr,
			Username: c.Username,
			Password: c.Password,
			// As the package advises: netlock bounds each call with the
			// node timeout.
			ContextTimeoutEnabled: true,
		})
		return goredis.New(rdb), func() { rdb.Close() }, nil
	})
}
