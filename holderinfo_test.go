package netlock

import (
	"strconv"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// keyValue is what a lock or writer key holds for the hold of value with
// token, taken with the default holder identity: "<value>:<token>:<holder>"
// (see lua/acquire.lua).
func keyValue(value string, token uint64) string {
	return value + ":" + strconv.FormatUint(token, 10) + ":" + keyspace.HolderEncode(defaultHolderInfo())
}
