// Package timeline holds what happened during a transition on one clock: the events
// that probes stream back and the transition events the suite records itself
// (stop-sent, exited, start-sent, ready, ...), all stamped with CLOCK_MONOTONIC. A
// Window is a snapshot of the timeline with the bounds an invariant is checked in,
// and renders any moment relative to the transition events around it.
package timeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
)

// Names of the transition events that the suite records around a driver call.
const (
	StopSent  = "stop-sent"  // the driver was asked to stop the agent (graceful)
	KillSent  = "kill-sent"  // the driver was asked to kill the agent (crash)
	Exited    = "exited"     // the agent has exited (the driver returned)
	StartSent = "start-sent" // the driver was asked to start the agent
	Ready     = "ready"      // the driver reports the agent ready
)

// DefaultLead is how long before the first transition event a spec's window starts.
const DefaultLead = time.Second

// Transition is an event of the suite: a step of the transition under test.
type Transition struct {
	Time   monotime.Time `json:"t"`
	Name   string        `json:"name"`
	Detail string        `json:"detail,omitempty"`
}

// Timeline collects probe events and transition events. It is safe for concurrent
// use; events may arrive in any order (an attempt is reported when it ends but
// stamped when it started) and are sorted when a Window is taken.
type Timeline struct {
	mu           sync.Mutex
	events       []probe.Event
	transitions  []Transition
	verdicts     []Verdict
	verdictMarks map[string]monotime.Time // node -> verdicts reported through
	awaits       []*await
}

// await is a caller of Await waiting for an event that matches.
type await struct {
	match func(probe.Event) bool
	found chan probe.Event // buffered: Add never blocks on it
}

// New returns an empty Timeline.
func New() *Timeline { return &Timeline{} }

// Add appends a probe event. Its signature fits probe.Options.OnEvent.
func (tl *Timeline) Add(e probe.Event) {
	tl.mu.Lock()
	tl.events = append(tl.events, e)
	if len(tl.awaits) > 0 {
		tl.awaits = slices.DeleteFunc(tl.awaits, func(a *await) bool {
			if !a.match(e) {
				return false
			}
			a.found <- e
			return true
		})
	}
	tl.mu.Unlock()
}

// Await returns the first probe event, already added or added later, for which match
// returns true, or ctx's error. match is called with the timeline locked, on every
// event added while it waits: keep it cheap.
func (tl *Timeline) Await(ctx context.Context, match func(probe.Event) bool) (probe.Event, error) {
	tl.mu.Lock()
	for _, e := range tl.events {
		if match(e) {
			tl.mu.Unlock()
			return e, nil
		}
	}
	a := &await{match: match, found: make(chan probe.Event, 1)}
	tl.awaits = append(tl.awaits, a)
	tl.mu.Unlock()
	select {
	case e := <-a.found:
		return e, nil
	case <-ctx.Done():
		tl.mu.Lock()
		tl.awaits = slices.DeleteFunc(tl.awaits, func(b *await) bool { return b == a })
		tl.mu.Unlock()
		select {
		case e := <-a.found: // matched meanwhile
			return e, nil
		default:
			return probe.Event{}, ctx.Err()
		}
	}
}

// Record stamps a transition event now and returns its time.
func (tl *Timeline) Record(name, detail string) monotime.Time {
	t := monotime.Now()
	tl.RecordAt(t, name, detail)
	return t
}

// RecordAt records a transition event that happened at t (for example a time the
// driver reported).
func (tl *Timeline) RecordAt(t monotime.Time, name, detail string) {
	tl.mu.Lock()
	tl.transitions = append(tl.transitions, Transition{Time: t, Name: name, Detail: detail})
	tl.mu.Unlock()
}

// Len returns the number of probe events held.
func (tl *Timeline) Len() int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return len(tl.events)
}

// Transitions returns the transition events, in time order.
func (tl *Timeline) Transitions() []Transition {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return sortedTransitions(tl.transitions)
}

// Window returns a snapshot of the timeline bounded by [start, end].
func (tl *Timeline) Window(start, end monotime.Time) Window {
	tl.mu.Lock()
	events := append([]probe.Event(nil), tl.events...)
	trans := sortedTransitions(tl.transitions)
	verdicts, marks := tl.snapshotVerdicts()
	tl.mu.Unlock()
	sort.SliceStable(events, func(i, j int) bool { return events[i].Time < events[j].Time })
	return Window{Start: start, End: end, Events: events, Transitions: trans, Verdicts: verdicts, VerdictsReported: marks}
}

// ErrNoTransition is returned for a window that needs transition events the
// timeline does not hold.
var ErrNoTransition = errors.New("no such transition event")

// TransitionWindow returns the window of a spec: from lead before the first
// transition event to settle after the last Ready event.
func (tl *Timeline) TransitionWindow(lead, settle time.Duration) (Window, error) {
	trans := tl.Transitions()
	if len(trans) == 0 {
		return Window{}, fmt.Errorf("transition window: %w: the timeline holds no transition event", ErrNoTransition)
	}
	var ready monotime.Time
	for _, t := range trans {
		if t.Name == Ready {
			ready = t.Time
		}
	}
	if ready == 0 {
		return Window{}, fmt.Errorf("transition window: %w: no %q event (did the agent come back?)", ErrNoTransition, Ready)
	}
	return tl.Window(trans[0].Time.Add(-lead), ready.Add(settle)), nil
}

// SpanWindow returns the window of a spec whose transition has no agent coming back
// (a service or endpoint change): from lead before the first transition event to
// settle after the last one.
func (tl *Timeline) SpanWindow(lead, settle time.Duration) (Window, error) {
	trans := tl.Transitions()
	if len(trans) == 0 {
		return Window{}, fmt.Errorf("span window: %w: the timeline holds no transition event", ErrNoTransition)
	}
	return tl.Window(trans[0].Time.Add(-lead), trans[len(trans)-1].Time.Add(settle)), nil
}

// Whole returns a window from the first to the last event or transition held.
func (tl *Timeline) Whole() Window {
	w := tl.Window(0, 0)
	first, last := monotime.Time(0), monotime.Time(0)
	see := func(t monotime.Time) {
		if t == 0 {
			return
		}
		if first == 0 || t < first {
			first = t
		}
		if t > last {
			last = t
		}
	}
	for _, e := range w.Events {
		if e.Kind != probe.KindExit {
			see(e.Time)
			see(e.End)
		}
	}
	for _, t := range w.Transitions {
		see(t.Time)
	}
	w.Start, w.End = first, last
	return w
}

func sortedTransitions(in []Transition) []Transition {
	out := append([]Transition(nil), in...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time < out[j].Time })
	return out
}
