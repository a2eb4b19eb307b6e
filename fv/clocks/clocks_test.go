package clocks

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

// host is a clock offset from the suite's, reached over a path whose two legs take
// out and back.
type host struct {
	offset    time.Duration
	out, back []time.Duration // per exchange; the last repeats
	now       monotime.Time   // the suite's clock
	n         int
}

func (h *host) ReadClock(context.Context) (Sample, error) {
	leg := func(ds []time.Duration) time.Duration { return ds[min(h.n, len(ds)-1)] }
	s := Sample{Sent: h.now}
	h.now = h.now.Add(leg(h.out))
	s.Stamp = h.now.Add(h.offset)
	h.now = h.now.Add(leg(h.back))
	s.Received = h.now
	h.now = h.now.Add(time.Millisecond)
	h.n++
	return s, nil
}

func TestMeasureKeepsTheLeastRoundTrip(t *testing.T) {
	// A queue on one leg now and then: 5 ms out and 0 back is off by 2.5 ms, and
	// only the symmetric 20 µs exchange bounds it to 10 µs.
	h := &host{offset: 1000 * time.Second, now: 1e12,
		out:  []time.Duration{5 * time.Millisecond, 10 * time.Microsecond, 3 * time.Millisecond},
		back: []time.Duration{0, 10 * time.Microsecond, 40 * time.Microsecond}}
	est, err := Measure(context.Background(), h, 3)
	if err != nil {
		t.Fatal(err)
	}
	if est.RTT != 20*time.Microsecond || est.Bound != 10*time.Microsecond || est.Samples != 3 {
		t.Errorf("kept rtt %v bound %v of %d; want the 20µs exchange, bound 10µs, of 3", est.RTT, est.Bound, est.Samples)
	}
	if d := est.Offset - h.offset; d < -est.Bound || d > est.Bound {
		t.Errorf("offset %v, true %v: off by %v, over its bound %v", est.Offset, h.offset, d, est.Bound)
	}
	if got := est.ToSuite(monotime.Time(2e12).Add(h.offset)); got != 2e12 {
		t.Errorf("ToSuite: %d, want 2e12", got)
	}
	if est.ToSuite(0) != 0 {
		t.Error("ToSuite(0): an unset time must stay unset")
	}
}

func TestTheBoundHoldsWhateverTheAsymmetry(t *testing.T) {
	for _, out := range []time.Duration{0, time.Microsecond, 70 * time.Microsecond, 3 * time.Millisecond} {
		h := &host{offset: -77 * time.Second, now: 5e12, out: []time.Duration{out}, back: []time.Duration{3*time.Millisecond - out}}
		est, err := Measure(context.Background(), h, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d := est.Offset - h.offset; d < -est.Bound || d > est.Bound {
			t.Errorf("out %v: offset %v is %v from the truth, over its bound %v", out, est.Offset, d, est.Bound)
		}
	}
}

func TestNoSamples(t *testing.T) {
	if _, err := FromSamples(nil); !errors.Is(err, ErrNoSamples) {
		t.Fatalf("got %v, want ErrNoSamples", err)
	}
	if _, err := FromSamples([]Sample{{Sent: 10, Stamp: 5, Received: 9}}); err == nil {
		t.Fatal("an answer before its request: want an error")
	}
}

func TestSpanUncertainty(t *testing.T) {
	first := Estimate{Offset: time.Second, Bound: 10 * time.Microsecond, Samples: 32}
	if u := (Span{First: first}).Uncertainty(); u != 10*time.Microsecond {
		t.Errorf("no second estimate: %v, want the first's bound", u)
	}
	// The offset moved 50 µs by the end, known to 5 µs: an event late in the run,
	// converted with the first offset, may be 55 µs off.
	sp := Span{First: first, Last: Estimate{Offset: time.Second - 50*time.Microsecond, Bound: 5 * time.Microsecond, Samples: 32}}
	if sp.Drift() != -50*time.Microsecond || sp.Uncertainty() != 55*time.Microsecond {
		t.Errorf("drift %v, uncertainty %v; want -50µs, 55µs", sp.Drift(), sp.Uncertainty())
	}
	if Signed(sp.Drift()) != "-50µs" || Signed(time.Second) != "+1s" {
		t.Errorf("Signed: %s, %s", Signed(sp.Drift()), Signed(time.Second))
	}
}
