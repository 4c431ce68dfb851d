package netlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCallBoundDeadline(t *testing.T) {
	by := time.Now().Add(50 * time.Millisecond)
	b := newCallBound(context.Background(), by)
	defer b.release()
	if dl, ok := b.Deadline(); !ok || !dl.Equal(by) {
		t.Fatalf("Deadline: got %v, %v, want %v, true", dl, ok, by)
	}
	if err := b.Err(); err != nil {
		t.Fatalf("Err before the deadline: got %v, want nil", err)
	}
	done := b.Done()
	select {
	case <-done:
		t.Fatal("Done closed before the deadline")
	default:
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed 5s after the deadline")
	}
	if err := b.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err after Done: got %v, want DeadlineExceeded", err)
	}
	if err := ctxErr(b); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctxErr after Done: got %v, want DeadlineExceeded", err)
	}
}

// TestCallBoundNoDone: without Done asked for, Err still ends at the
// deadline, and a Done asked for afterwards is closed.
func TestCallBoundNoDone(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := newCallBound(parent, time.Now().Add(-time.Millisecond))
	defer b.release()
	if err := b.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err after the deadline: got %v, want DeadlineExceeded", err)
	}
	// The parent, a cancelCtx, has not ended: its cause is nil, and ctxErr
	// falls back on Err.
	if err := ctxErr(b); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctxErr after the deadline: got %v, want DeadlineExceeded", err)
	}
	select {
	case <-b.Done():
	default:
		t.Fatal("Done asked for after the deadline is not closed")
	}
}

// TestCallBoundDoneFirst: Done asked for first, after the deadline, is
// closed.
func TestCallBoundDoneFirst(t *testing.T) {
	b := newCallBound(context.Background(), time.Now().Add(-time.Millisecond))
	defer b.release()
	select {
	case <-b.Done():
	default:
		t.Fatal("Done asked for first after the deadline is not closed")
	}
	if err := b.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err: got %v, want DeadlineExceeded", err)
	}
}

func TestCallBoundParentEnds(t *testing.T) {
	why := errors.New("caller gave up")
	for _, askDone := range []bool{false, true} {
		parent, cancel := context.WithCancelCause(context.Background())
		b := newCallBound(parent, time.Now().Add(time.Hour))
		var done <-chan struct{}
		if askDone {
			done = b.Done()
		}
		cancel(why)
		if askDone {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Done not closed when the parent ended")
			}
		}
		if err := b.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("Err after the parent ended (Done asked for: %v): got %v, want Canceled", askDone, err)
		}
		if err := ctxErr(b); !errors.Is(err, why) {
			t.Errorf("ctxErr after the parent ended (Done asked for: %v): got %v, want the parent's cause", askDone, err)
		}
		b.release()
	}
}
