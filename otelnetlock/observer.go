package otelnetlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/netlock-go/netlock"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the Observer's meter and tracer:
// this package's import path.
const ScopeName = "github.com/netlock-go/netlock/otelnetlock"

// spanName is the name of the span of an acquire call.
const spanName = "netlock.acquire"

// Bucket boundaries, in seconds, given as advice to the histograms.
var (
	// waitBuckets: from a local hand-off (tens of microseconds) and a round
	// trip to Redis (a millisecond or less) to long waits behind a holder.
	waitBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
	// holdBuckets: from a counter's increment to a batch job's hour.
	holdBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600}
	// extendBuckets: one round trip, bounded by the node timeout (default
	// 500ms).
	extendBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}
)

// NewObserver returns a netlock.Observer that records what the NetMutexes it
// is given to (with netlock.WithObserver) do, as the metrics and spans of the
// package documentation. It returns an error if an option is bad or an
// instrument cannot be made.
//
// The Observer is safe for concurrent use and may serve any number of
// NetMutexes. netlock calls its functions on the path of every lock call;
// they only record into the providers' instruments and spans, and leave
// exporting to the providers (a batching span processor keeps it off that
// path).
func NewObserver(opts ...Option) (netlock.Observer, error) {
	c, err := newConfig(opts)
	if err != nil {
		return netlock.Observer{}, err
	}
	r, err := newRecorder(c)
	if err != nil {
		return netlock.Observer{}, err
	}
	return netlock.Observer{Acquire: r.acquire, Unlock: r.unlock, Extend: r.extend, Lost: r.lost}, nil
}

// recorder holds an Observer's instruments and tracer.
type recorder struct {
	tracer     trace.Tracer
	lockName   func(name string) string
	waitTime   metric.Float64Histogram
	holdTime   metric.Float64Histogram
	extendTime metric.Float64Histogram
	lostHolds  metric.Int64Counter
	errors     metric.Int64Counter
}

func newRecorder(c config) (*recorder, error) {
	meter := c.meterProvider.Meter(ScopeName)
	r := &recorder{tracer: c.tracerProvider.Tracer(ScopeName), lockName: c.lockName}
	var errs [5]error
	r.waitTime, errs[0] = meter.Float64Histogram("netlock.lock.wait_time",
		metric.WithUnit("s"),
		metric.WithDescription("The time a lock's LockCtx or TryLockCtx took, from its call to its return."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	r.holdTime, errs[1] = meter.Float64Histogram("netlock.lock.hold_time",
		metric.WithUnit("s"),
		metric.WithDescription("The time a lock was held, from the acquire's return to the unlock."),
		metric.WithExplicitBucketBoundaries(holdBuckets...))
	r.extendTime, errs[2] = meter.Float64Histogram("netlock.lock.extend_time",
		metric.WithUnit("s"),
		metric.WithDescription("The time an extend round of a held lock took."),
		metric.WithExplicitBucketBoundaries(extendBuckets...))
	r.lostHolds, errs[3] = meter.Int64Counter("netlock.lock.lost_holds",
		metric.WithUnit("{hold}"),
		metric.WithDescription("Holds of a lock that were lost: expired, deleted or taken before their unlock."))
	r.errors, errs[4] = meter.Int64Counter("netlock.lock.errors",
		metric.WithUnit("{error}"),
		metric.WithDescription("Errors that a lock's acquire, unlock or extend ended with."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("otelnetlock: making the instruments: %w", err)
	}
	return r, nil
}

// acquire is Observer.Acquire: it starts the call's span as a child of ctx's,
// and returns the span's context, which netlock's calls to Redis carry (so a
// client library's spans nest under it), and the function that records the
// call's end.
func (r *recorder) acquire(ctx context.Context, a netlock.AcquireStart) (context.Context, func(netlock.AcquireDone)) {
	ctx, span := r.tracer.Start(ctx, spanName,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(appendKind([]attribute.KeyValue{lockNameKey.String(a.Name), tryKey.Bool(a.Try)}, a.Kind)...))
	return ctx, func(d netlock.AcquireDone) {
		outcome, errType := acquireOutcome(d)

		// ctx carries the span: a metrics SDK that keeps exemplars links
		// the measurements to it.
		attrs := r.appendLockName(make([]attribute.KeyValue, 0, 7), d.Name, d.Kind)
		attrs = append(attrs, tryKey.Bool(d.Try), outcomeKey.String(outcome),
			contendedKey.Bool(d.Contended), acquireHandedOverKey.Bool(d.HandedOver))
		if errType != "" {
			attrs = append(attrs, errorTypeKey.String(errType))
		}
		r.waitTime.Record(ctx, d.Wait.Seconds(), metric.WithAttributes(attrs...))
		if errType != "" {
			r.countError(ctx, d.Name, d.Kind, operationAcquire, errType)
		}

		span.SetAttributes(outcomeKey.String(outcome), contendedKey.Bool(d.Contended), acquireHandedOverKey.Bool(d.HandedOver))
		if d.Acquired && d.Token != 0 {
			// Redis integers are signed 64-bit: a token fits an int64.
			span.SetAttributes(tokenKey.Int64(int64(d.Token)))
		}
		if d.Err != nil {
			span.SetAttributes(errorTypeKey.String(errType))
			span.RecordError(d.Err)
			span.SetStatus(codes.Error, d.Err.Error())
		}
		span.End()
	}
}

// unlock is Observer.Unlock.
func (r *recorder) unlock(ctx context.Context, u netlock.UnlockDone) {
	attrs := r.appendLockName(make([]attribute.KeyValue, 0, 4), u.Name, u.Kind)
	attrs = append(attrs, unlockHandedOverKey.Bool(u.HandedOver))
	if u.Err != nil {
		errType := errorType(u.Err)
		attrs = append(attrs, errorTypeKey.String(errType))
		r.countError(ctx, u.Name, u.Kind, operationUnlock, errType)
	}
	r.holdTime.Record(ctx, u.Held.Seconds(), metric.WithAttributes(attrs...))
}

// extend is Observer.Extend.
func (r *recorder) extend(ctx context.Context, x netlock.ExtendDone) {
	attrs := r.appendLockName(make([]attribute.KeyValue, 0, 3), x.Name, x.Kind)
	if x.Err != nil {
		errType := errorType(x.Err)
		attrs = append(attrs, errorTypeKey.String(errType))
		r.countError(ctx, x.Name, x.Kind, operationExtend, errType)
	}
	r.extendTime.Record(ctx, x.Took.Seconds(), metric.WithAttributes(attrs...))
}

// lost is Observer.Lost.
func (r *recorder) lost(l netlock.LostHold) {
	attrs := r.appendLockName(make([]attribute.KeyValue, 0, 3), l.Name, l.Kind)
	attrs = append(attrs, lostReasonKey.String(string(l.Reason)))
	r.lostHolds.Add(context.Background(), 1, metric.WithAttributes(attrs...))
}

// countError adds one to netlock.lock.errors.
func (r *recorder) countError(ctx context.Context, name string, kind netlock.Kind, operation, errType string) {
	attrs := r.appendLockName(make([]attribute.KeyValue, 0, 4), name, kind)
	attrs = append(attrs, operationKey.String(operation), errorTypeKey.String(errType))
	r.errors.Add(ctx, 1, metric.WithAttributes(attrs...))
}

// appendLockName appends netlock.lock.name, as WithMetricLockName says, and netlock.lock.kind to
// the attributes of a metric about the lock name.
func (r *recorder) appendLockName(attrs []attribute.KeyValue, name string, kind netlock.Kind) []attribute.KeyValue {
	if v := r.lockName(name); v != "" {
		attrs = append(attrs, lockNameKey.String(v))
	}
	return appendKind(attrs, kind)
}

// appendKind appends netlock.lock.kind ("read" or "write") for a
// NetRWMutex's events, "semaphore" for a Semaphore's; a NetMutex's carry
// none.
func appendKind(attrs []attribute.KeyValue, kind netlock.Kind) []attribute.KeyValue {
	if kind != "" && kind != netlock.KindMutex {
		attrs = append(attrs, lockKindKey.String(string(kind)))
	}
	return attrs
}
