package matchers_test

import (
	"fmt"
	"time"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// A spec checks its window after the probes reported past its end, then prints each
// figure next to its budget.
func ExampleHaveNoFailedAttempts() {
	tl := timeline.New()
	tl.Add(probe.Event{Time: at(0), Kind: probe.KindReady, Probe: "ext", Role: probe.RoleConnect})
	for i := 1; i <= 500; i++ {
		e := probe.Event{Time: at(float64(2 * i)), Kind: probe.KindAttempt, Probe: "ext", Seq: uint64(i), Outcome: probe.OK, Backend: "pod-a", Target: "10.0.0.1:30080"}
		if i == 260 {
			e.Outcome, e.Latency, e.Err = probe.Refused, 200*time.Microsecond, "connect: connection refused (RST or ICMP port unreachable)"
		}
		tl.Add(e)
	}
	tl.Add(probe.Event{Time: at(1100), Kind: probe.KindDone, Probe: "ext"})
	tl.RecordAt(at(500), timeline.StopSent, "")
	tl.RecordAt(at(580), timeline.Exited, "")
	tl.RecordAt(at(600), timeline.StartSent, "")
	tl.RecordAt(at(700), timeline.Ready, "")

	m := matchers.HaveNoFailedAttempts()
	ok, err := m.Match(tl.Window(at(100), at(1000)))
	fmt.Println(ok, err, m.Result().Verdict)
	fmt.Println(m.Result().Figures[0].Text)
	fmt.Println(m.Result().First)
	// Output:
	// false <nil> violation
	// failed 1 of 451 attempts (budget 0): 1 reset
	// probe ext, started 20.0 ms after stop-sent (60.0 ms before exited): attempt #260 to 10.0.0.1:30080: REFUSED after 0.2 ms (connect: connection refused (RST or ICMP port unreachable))
}
