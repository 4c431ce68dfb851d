package keyspace

import (
	"net/url"
	"strings"
)

// A holder's identity (netlock.WithHolderInfo) is written with its hold: at
// the end of a lock or writer key's value, "<value>:<token>:<holder>", and
// at the end of a waiter's queue member, "<id>+<expiry ms>+<nonce>+<holder>",
// from where a release that grants the waiter the lock copies it into the
// key. The scripts split those on ':' and '+', so the holder is written
// with '%', ':', '+' and '#' escaped as URL escapes; HolderDecode undoes it.
// A lease (a member of a sorted set, with nothing beside it) carries its
// holder at the end of its value (LeaseSuffix).

// holderEscape escapes the bytes the scripts split on (':', '+', and '#',
// which a Semaphore's fields are named with), and '%'.
var holderEscape = strings.NewReplacer("%", "%25", ":", "%3A", "+", "%2B", "#", "%23")

// HolderEncode returns holder as it is written in Redis.
func HolderEncode(holder string) string { return holderEscape.Replace(holder) }

// HolderDecode returns the holder that HolderEncode wrote as s; s itself if
// it is not such an encoding (a value netlock did not write).
func HolderDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	d, err := url.PathUnescape(s)
	if err != nil {
		return s
	}
	return d
}

// LeaseSuffix returns what ends the value of a lease taken by holder (as
// HolderEncode wrote it), where the value is a member of a sorted set with
// nothing beside it (a NetRWMutex's read lease, a Semaphore's lease):
// "+<holder>", or "" for none. LeaseHolder reads it back.
func LeaseSuffix(holder string) string {
	if holder == "" {
		return ""
	}
	return "+" + holder
}

// LeaseHolder returns the holder at the end of a lease's value (see
// LeaseSuffix), decoded; "" if it has none.
func LeaseHolder(lease string) string {
	_, h, ok := strings.Cut(lease, "+")
	if !ok {
		return ""
	}
	return HolderDecode(h)
}

// HolderOf returns the holder at the end of a lock or writer key's value,
// "<value>:<token>:<holder>", decoded; "" if the value has none. A lock
// key's value may end with a '+' after the holder, which says the waiters'
// queue may exist (see lua/acquire.lua); a holder never holds one (it is
// escaped).
func HolderOf(value string) string {
	_, rest, ok := strings.Cut(value, ":")
	if !ok {
		return ""
	}
	_, h, ok := strings.Cut(rest, ":")
	if !ok {
		return ""
	}
	return HolderDecode(strings.TrimSuffix(h, "+"))
}
