package timeline

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/probe"
)

// Await finds an event added before it, waits for one added later, ignores what does
// not match, and gives up with its context.
func TestAwait(t *testing.T) {
	tl := New()
	tl.Add(probe.Event{Time: 1, Kind: probe.KindRecv, Probe: "d", From: "a"})
	from := func(name string) func(probe.Event) bool {
		return func(e probe.Event) bool { return e.Kind == probe.KindRecv && e.From == name }
	}
	if e, err := tl.Await(context.Background(), from("a")); err != nil || e.Time != 1 {
		t.Fatalf("an event added before: %+v, %v", e, err)
	}

	got := make(chan probe.Event)
	go func() {
		e, err := tl.Await(context.Background(), from("b"))
		if err != nil {
			t.Error(err)
		}
		got <- e
	}()
	for !awaiting(tl) {
		time.Sleep(time.Millisecond)
	}
	tl.Add(probe.Event{Time: 2, Kind: probe.KindRecv, Probe: "d", From: "c"})
	tl.Add(probe.Event{Time: 3, Kind: probe.KindRecv, Probe: "d", From: "b"})
	if e := <-got; e.Time != 3 {
		t.Fatalf("an event added later: got %+v, want the one at 3", e)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := tl.Await(ctx, from("nobody")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("nothing matches: %v, want the context's deadline", err)
	}
	if awaiting(tl) {
		t.Fatal("an await that gave up is still registered")
	}
}

func awaiting(tl *Timeline) bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return len(tl.awaits) > 0
}
