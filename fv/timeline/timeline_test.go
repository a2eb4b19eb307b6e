package timeline_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

const ms = monotime.Time(time.Millisecond)

func TestConcurrentAddsAreSortedInWindows(t *testing.T) {
	tl := timeline.New()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				// Reported out of order, as attempts are (stamped at start, sent at end).
				tl.Add(probe.Event{Time: monotime.Time(1000-i)*ms + monotime.Time(g), Kind: probe.KindAttempt, Probe: "p"})
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 100; i++ {
			tl.RecordAt(monotime.Time(i)*10*ms, "step", "")
		}
	}()
	wg.Wait()
	if tl.Len() != 8000 {
		t.Fatalf("Len = %d, want 8000", tl.Len())
	}
	w := tl.Window(100*ms, 200*ms)
	for i := 1; i < len(w.Events); i++ {
		if w.Events[i].Time < w.Events[i-1].Time {
			t.Fatalf("events not sorted at %d", i)
		}
	}
	if n := len(w.Inside()); n != 8*100+1 { // [100 ms, 200 ms]: the +g ns offsets push seven past the end
		t.Fatalf("Inside = %d events, want %d", n, 8*100+1)
	}
	if len(w.Transitions) != 100 {
		t.Fatalf("transitions = %d", len(w.Transitions))
	}
}

func TestTransitionWindow(t *testing.T) {
	tl := timeline.New()
	if _, err := tl.TransitionWindow(time.Second, 3*time.Second); !errors.Is(err, timeline.ErrNoTransition) {
		t.Fatalf("empty timeline: err = %v", err)
	}
	tl.RecordAt(10_000*ms, timeline.StopSent, "SIGTERM")
	tl.RecordAt(10_200*ms, timeline.Exited, "")
	if _, err := tl.TransitionWindow(time.Second, 3*time.Second); !errors.Is(err, timeline.ErrNoTransition) {
		t.Fatalf("without ready: err = %v", err)
	}
	tl.RecordAt(10_300*ms, timeline.StartSent, "")
	tl.RecordAt(10_900*ms, timeline.Ready, "")
	w, err := tl.TransitionWindow(time.Second, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if w.Start != 9_000*ms || w.End != 13_900*ms {
		t.Fatalf("window = [%v, %v]", w.Start, w.End)
	}
	for _, c := range []struct {
		at   monotime.Time
		want string
	}{
		{10_132 * ms, "132.0 ms after stop-sent (68.0 ms before exited)"},
		{9_500 * ms, "500.0 ms before stop-sent"},
		{11_000 * ms, "100.0 ms after ready"},
	} {
		if got := w.Relative(c.at); got != c.want {
			t.Errorf("Relative(%v) = %q, want %q", c.at, got, c.want)
		}
	}
	if got := w.String(); got != "window from 1.0 s before stop-sent to 3.0 s after ready (4.9 s)" {
		t.Errorf("String = %q", got)
	}
}

func TestExcerptGroupsRoutineEventsAndMarksHighlights(t *testing.T) {
	tl := timeline.New()
	tl.RecordAt(1000*ms, timeline.StopSent, "SIGTERM")
	for i := 0; i < 100; i++ {
		e := probe.Event{Time: monotime.Time(950+i) * ms, Kind: probe.KindAttempt, Probe: "ext", Seq: uint64(i + 1), Outcome: probe.OK, Backend: "a", Target: "t"}
		if i == 60 {
			e.Outcome, e.Err = probe.Reset, "receive: connection reset (RST)"
		}
		tl.Add(e)
	}
	w := tl.Whole()
	out := w.Excerpt(1010*ms, 100*time.Millisecond, 100*time.Millisecond, func(e probe.Event) bool { return e.Outcome == probe.Reset })
	t.Log("\n" + out)
	for _, want := range []string{
		"(times relative to stop-sent; 10.0 ms after stop-sent)",
		"-50.000 ms  ext          attempts #1..#50 ok (50 over 49.0 ms",
		"===== stop-sent (SIGTERM) =====",
		"+10.000 ms  ext          attempt #61 to t: RESET after 0.0 ms (receive: connection reset (RST))   <==",
		"attempts #62..#100 ok",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("excerpt lacks %q", want)
		}
	}
}

func TestSpanWindow(t *testing.T) {
	tl := timeline.New()
	if _, err := tl.SpanWindow(time.Second, time.Second); !errors.Is(err, timeline.ErrNoTransition) {
		t.Fatalf("an empty timeline has no span: %v", err)
	}
	tl.RecordAt(10*ms, "backend-added", "")
	tl.RecordAt(30*ms, "backend-removed", "")
	w, err := tl.SpanWindow(5*time.Millisecond, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if w.Start != 5*ms || w.End != 50*ms {
		t.Fatalf("span window [%d, %d], want [5 ms, 50 ms]", w.Start, w.End)
	}
}

func TestWordingForPeople(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0.0 ms"},
		{18 * time.Millisecond, "18.0 ms"},
		{999_940 * time.Microsecond, "999.9 ms"},
		{time.Second, "1.0 s"},
		{4100 * time.Millisecond, "4.1 s"},
		{1523 * time.Millisecond, "1.523 s"},
		{-250 * time.Millisecond, "-250.0 ms"},
	} {
		if got := timeline.Duration(tc.d); got != tc.want {
			t.Errorf("Duration(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}

	tl := timeline.New()
	tl.RecordAt(10_000*ms, timeline.StopSent, "")
	tl.RecordAt(10_900*ms, timeline.Ready, "")
	w := tl.Window(9_000*ms, 13_100*ms)
	if got, want := w.String(), "window from 1.0 s before stop-sent to 2.2 s after ready (4.1 s)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		at   monotime.Time
		want string
	}{
		{10_000 * ms, "at stop-sent"},
		{10_900 * ms, "at ready"},
		{10_450 * ms, "450.0 ms after stop-sent (450.0 ms before ready)"},
	} {
		if got := w.Relative(tc.at); got != tc.want {
			t.Errorf("Relative(%v) = %q, want %q", tc.at, got, tc.want)
		}
	}

	// A window with no transition event (a steady state) is described by its length
	// and its moments by how far into it they are: never "+0.0 ms after the window
	// start".
	bare := timeline.New().Window(1_000*ms, 2_000*ms)
	if got, want := bare.String(), "window of 1.0 s"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		at   monotime.Time
		want string
	}{
		{1_000 * ms, "at the window start"},
		{1_250 * ms, "250.0 ms into the window"},
		{900 * ms, "100.0 ms before the window start"},
	} {
		if got := bare.Relative(tc.at); got != tc.want {
			t.Errorf("Relative(%v) = %q, want %q", tc.at, got, tc.want)
		}
	}
}

// Describe never prints an empty name: an event that lacks a field says so.
func TestDescribeNamesWhatIsMissing(t *testing.T) {
	kinds := []probe.Kind{probe.KindReady, probe.KindAttempt, probe.KindOpen, probe.KindEcho, probe.KindGap, probe.KindEnd,
		probe.KindStall, probe.KindServerStall, probe.KindSent, probe.KindReply, probe.KindRecv, probe.KindReach, probe.KindError, probe.KindDone, probe.KindExit}
	for _, k := range kinds {
		for _, o := range []probe.Outcome{probe.OK, probe.Reset} {
			e := probe.Event{Kind: k, Outcome: o}
			got := timeline.Describe(e)
			for _, bad := range []string{"  ", "()", "( ", " )", "by ,", "by  ", "to :", "from  ", ": (", " :"} {
				if strings.Contains(got, bad) {
					t.Errorf("Describe(%s, %s) = %q: contains %q, an empty field printed", k, o, got, bad)
				}
			}
			if strings.HasSuffix(got, " ") || strings.HasSuffix(got, "by") || strings.HasSuffix(got, "to") {
				t.Errorf("Describe(%s, %s) = %q ends on an empty field", k, o, got)
			}
		}
	}
}
