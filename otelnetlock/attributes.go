package otelnetlock

import (
	"context"
	"errors"

	"github.com/netlock-go/netlock"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Attribute keys, as the package documentation lists them.
const (
	lockNameKey          = attribute.Key("netlock.lock.name")
	lockKindKey          = attribute.Key("netlock.lock.kind")
	tokenKey             = attribute.Key("netlock.lock.token")
	tryKey               = attribute.Key("netlock.acquire.try")
	outcomeKey           = attribute.Key("netlock.acquire.outcome")
	contendedKey         = attribute.Key("netlock.acquire.contended")
	acquireHandedOverKey = attribute.Key("netlock.acquire.handed_over")
	unlockHandedOverKey  = attribute.Key("netlock.unlock.handed_over")
	operationKey         = attribute.Key("netlock.operation")
	lostReasonKey        = attribute.Key("netlock.lost.reason")
	errorTypeKey         = semconv.ErrorTypeKey // "error.type"
)

// Values of netlock.acquire.outcome.
const (
	outcomeAcquired = "acquired"
	outcomeBusy     = "busy"
	outcomeError    = "error"
)

// Values of netlock.operation.
const (
	operationAcquire = "acquire"
	operationUnlock  = "unlock"
	operationExtend  = "extend"
)

// errorType returns the value of error.type for err, an error a NetMutex
// returned, by the first rule of the package documentation's table that
// matches.
func errorType(err error) string {
	switch {
	case errors.Is(err, netlock.ErrQuorum):
		// Before the context errors: a wait that ended while Redis did not
		// answer matches both, and Redis is what an operator must fix.
		return "quorum"
	case errors.Is(err, netlock.ErrLockLost):
		return "lock_lost"
	case errors.Is(err, netlock.ErrNotHeld):
		return "not_held"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, netlock.ErrNotObtained):
		return "not_obtained"
	default:
		return semconv.ErrorTypeOther.Value.AsString() // "_OTHER"
	}
}

// acquireOutcome returns the values of netlock.acquire.outcome and error.type ("" if
// none) for an acquire call that ended as d says.
func acquireOutcome(d netlock.AcquireDone) (outcome, errType string) {
	switch {
	case d.Err != nil:
		return outcomeError, errorType(d.Err)
	case d.Acquired:
		return outcomeAcquired, ""
	default:
		return outcomeBusy, ""
	}
}
