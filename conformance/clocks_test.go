package conformance

import (
	"strings"
	"testing"
	"time"
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
