// Package clocks relates another host's CLOCK_MONOTONIC to the suite's by
// measurement, as NTP does: the suite sends a request at Sent (its clock), the host
// stamps it at Stamp (its clock), and the answer is back at Received (the suite's).
// Whatever the two legs' delays, the host read its clock somewhere between Sent and
// Received, so the offset Stamp - (Sent+Received)/2 is wrong by at most half the
// round trip. Of many exchanges the one of least round trip gives the tightest bound;
// a path that queues now and then (a busy pipe, a scheduler that runs the host's
// probe late) only widens the exchanges it delays, which are dropped.
//
// Two machines' monotonic clocks also drift apart (tens of parts per million for
// clocks that no one slews; NTP-disciplined ones less). An estimate taken at the start
// of a run and one taken at its end bound the drift over the run: Span says how far an
// event converted with the first may be from the truth anywhere in between.
package clocks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

// Sample is one exchange: the suite's times around it, and the host's reading.
type Sample struct {
	Sent     monotime.Time // the suite's clock, before the request went out
	Stamp    monotime.Time // the host's clock, when it read the request
	Received monotime.Time // the suite's clock, when the answer was in
}

// RTT is the exchange's round trip.
func (s Sample) RTT() time.Duration { return s.Received.Sub(s.Sent) }

// Offset is the host's clock minus the suite's, by this exchange: exact to within
// half its round trip.
func (s Sample) Offset() time.Duration {
	mid := s.Sent + (s.Received-s.Sent)/2
	return s.Stamp.Sub(mid)
}

// Estimate is what a series of exchanges says of a host's clock.
type Estimate struct {
	// Offset is the host's clock minus the suite's: an event the host stamped at t
	// happened at t - Offset on the suite's clock.
	Offset time.Duration
	// Bound is how far Offset may be from the truth at At: half the least round trip.
	Bound time.Duration
	// RTT is the least round trip, Samples how many exchanges were made.
	RTT     time.Duration
	Samples int
	// At is when, on the suite's clock, the best exchange was made.
	At monotime.Time
}

// ErrNoSamples is the error of an estimate from no exchange.
var ErrNoSamples = errors.New("no clock exchange completed")

// FromSamples is the estimate of the exchange of least round trip.
func FromSamples(samples []Sample) (Estimate, error) {
	if len(samples) == 0 {
		return Estimate{}, ErrNoSamples
	}
	best := slices.MinFunc(samples, func(a, b Sample) int { return cmp.Compare(a.RTT(), b.RTT()) })
	if best.RTT() < 0 {
		return Estimate{}, fmt.Errorf("a clock exchange answered before it was asked (sent %d, received %d): the suite's clock is not monotonic", best.Sent, best.Received)
	}
	return Estimate{
		Offset:  best.Offset(),
		Bound:   (best.RTT() + 1) / 2,
		RTT:     best.RTT(),
		Samples: len(samples),
		At:      best.Sent + (best.Received-best.Sent)/2,
	}, nil
}

// ToSuite converts a reading of the host's clock to the suite's.
func (e Estimate) ToSuite(t monotime.Time) monotime.Time {
	if t == 0 {
		return 0 // unset stays unset
	}
	return t.Add(-e.Offset)
}

// String is "+16m40.000214s ±41µs".
func (e Estimate) String() string {
	return fmt.Sprintf("%s ±%v", Signed(e.Offset), e.Bound)
}

// Signed writes d with its sign, "+16m40s" or "-3ms": an offset reads either way.
func Signed(d time.Duration) string {
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}

// Exchanger makes one exchange with a host (a probe's ReadClock).
type Exchanger interface {
	ReadClock(ctx context.Context) (Sample, error)
}

// Exchanges is how many exchanges Measure makes: enough that, on a busy machine, a
// few of them meet no queue on either leg.
const Exchanges = 32

// Measure makes n exchanges with x, one after another, and returns their estimate.
func Measure(ctx context.Context, x Exchanger, n int) (Estimate, error) {
	samples := make([]Sample, 0, n)
	for range n {
		s, err := x.ReadClock(ctx)
		if err != nil {
			return Estimate{}, err
		}
		samples = append(samples, s)
	}
	return FromSamples(samples)
}

// Span is what a host's clock did over a run: the estimate every event was converted
// with (First), and one made at the end (Last).
type Span struct {
	First, Last Estimate
}

// Drift is how far the offset moved between the two estimates.
func (s Span) Drift() time.Duration { return s.Last.Offset - s.First.Offset }

// Uncertainty bounds how far an event the host stamped between the two estimates,
// converted with First, may be from its true time on the suite's clock. At the start
// that is First's bound; at the end, how far the offset moved plus Last's bound; two
// crystals drift at a steady rate over minutes, so in between it is no more than the
// larger of the two. With no Last it is First's bound.
func (s Span) Uncertainty() time.Duration {
	if s.Last.Samples == 0 {
		return s.First.Bound
	}
	return max(s.First.Bound, abs(s.Drift())+s.Last.Bound)
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
