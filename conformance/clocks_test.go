package conformance

import (
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/clocks"
	"github.com/dpconform/dpconform/fv/harness"
)

// TestClockRefusal: on hosts of other clocks, a spec is refused when a time it judges
// is under ten times clock-uncertainty; a probe's schedule is not judged.
func TestClockRefusal(t *testing.T) {
	b := DefaultBudgets
	b.ClockUncertainty = 30 * time.Millisecond
	if why := b.ClockRefusal([]string{"connect-interval", "stream-max-gap"}); !strings.Contains(why, "stream-max-gap=200ms is under ten times clock-uncertainty=30ms") {
		t.Errorf("stream-max-gap 200 ms at 30 ms of uncertainty: %q", why)
	}
	if why := b.ClockRefusal([]string{"connect-interval", "order-interval", "end-within"}); why != "" {
		t.Errorf("schedules and a 2 s budget at 30 ms: refused as %q", why)
	}
}

// TestClocksWithin: a host whose times may be further off than clock-uncertainty
// (its bound, or its drift over the run) makes the run an error, with the figures.
func TestClocksWithin(t *testing.T) {
	o := &oneRun{r: &Runner{cfg: Config{Budgets: DefaultBudgets}}}
	quiet := harness.HostClock{Host: "node-a", Span: clocks.Span{
		First: clocks.Estimate{Offset: time.Hour, Bound: 20 * time.Microsecond, RTT: 40 * time.Microsecond, Samples: 32},
		Last:  clocks.Estimate{Offset: time.Hour + 3*time.Microsecond, Bound: 20 * time.Microsecond, Samples: 32}}}
	if err := o.clocksWithin([]harness.HostClock{quiet}); err != nil {
		t.Fatalf("23 µs of 5 ms: %v", err)
	}
	drifted := quiet
	drifted.Last.Offset = time.Hour + 6*time.Millisecond
	err := o.clocksWithin([]harness.HostClock{quiet, drifted})
	if err == nil || !strings.Contains(err.Error(), "node-a's clock is +1h0m0s ±20µs from the suite's with an uncertainty of 6.02ms") ||
		!strings.Contains(err.Error(), "over clock-uncertainty=5ms") {
		t.Fatalf("a clock that drifted 6 ms over the run: %v", err)
	}
}
