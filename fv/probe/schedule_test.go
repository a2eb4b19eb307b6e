package probe

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

// A schedule never runs a slot early, whichever way it waits (kernel sleep under
// preciseBelow, Go timer above), and stops when its context is done.
func TestScheduleKeepsItsSlots(t *testing.T) {
	for _, interval := range []time.Duration{250 * time.Microsecond, 2 * time.Millisecond} {
		t.Run(interval.String(), func(t *testing.T) {
			const slots = 40
			start := monotime.Now() // before the schedule's own start
			s := newSchedule(interval)
			defer s.stop()
			for i := range slots {
				if !s.wait(context.Background()) {
					t.Fatalf("slot %d: wait returned false with a live context", i)
				}
			}
			// The first slot is at once, slot k no earlier than start+k*interval.
			if got, least := monotime.Since(start), time.Duration(slots-1)*interval; got < least {
				t.Fatalf("%d slots at %v took %v, less than %v: a slot ran early", slots, interval, got, least)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if s.wait(ctx) {
				t.Fatal("wait returned true with a cancelled context")
			}
		})
	}
}

// BenchmarkScheduleGaps measures the gaps a 250 µs schedule keeps between slots,
// waiting in the kernel (what a schedule under preciseBelow does) and on a Go timer
// (what it did before), side by side: the figures are the gaps' percentiles.
func BenchmarkScheduleGaps(b *testing.B) {
	const interval = 250 * time.Microsecond
	waits := map[string]func(until monotime.Time){
		"kernel": monotime.SleepUntil,
		"go-timer": func(until monotime.Time) {
			if d := monotime.Until(until); d > 0 {
				<-time.After(d)
			}
		},
	}
	for _, name := range []string{"kernel", "go-timer"} {
		b.Run(name, func(b *testing.B) {
			wait := waits[name]
			var gaps []time.Duration
			next, last := monotime.Now(), monotime.Now()
			for b.Loop() {
				next = next.Add(interval)
				if now := monotime.Now(); now.Sub(next) > interval {
					next = now
				}
				wait(next)
				now := monotime.Now()
				gaps = append(gaps, now.Sub(last))
				last = now
			}
			slices.Sort(gaps)
			for _, p := range []int{50, 90, 99} {
				b.ReportMetric(float64(gaps[len(gaps)*p/100].Microseconds()), "µs-p"+strconv.Itoa(p))
			}
		})
	}
}
