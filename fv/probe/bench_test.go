package probe_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/privileged"
)

// benchRun is how long each benchmark drives its probe; the figures are rates over it,
// so b.N plays no part (one run is longer than the default -benchtime).
const benchRun = 3 * time.Second

func benchLab(b *testing.B) (*lab, context.Context) {
	if why := privileged.Missing(); why != "" && !privileged.Required() {
		fmt.Fprintf(os.Stderr, "*** %s: SKIPPED: %s ***\n", b.Name(), why)
	}
	privileged.Require(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	b.Cleanup(cancel)
	l, err := newLab(ctx, func(f func() error) {
		b.Cleanup(func() {
			if err := f(); err != nil {
				b.Error(err)
			}
		})
	}, os.Stderr)
	if err != nil {
		b.Fatal(err)
	}
	return l, ctx
}

// drive runs a client probe against a fresh server for benchRun and reports its
// events, the wall time, and the CPU of both processes.
func drive(b *testing.B, serve probe.Serve, client probe.Config) (evs []probe.Event, wall time.Duration, cli, srv probe.Usage) {
	l, ctx := benchLab(b)
	s, err := l.start(ctx, l.pair.Server, serve)
	if err != nil {
		b.Fatal(err)
	}
	t0 := monotime.Now()
	c, err := l.start(ctx, l.pair.Client, client)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(benchRun)
	if err := c.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	wall = monotime.Since(t0)
	if err := s.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	cli, _ = c.Usage()
	srv, _ = s.Usage()
	return c.Events(), wall, cli, srv
}

func cpuPercent(u probe.Usage, wall time.Duration) float64 {
	return 100 * float64(u.User+u.System) / float64(wall)
}

// BenchmarkConnect reports the sustained rate of new connections a connect probe
// makes at a given interval, and what that costs the probe and the server in CPU.
func BenchmarkConnect(b *testing.B) {
	for _, every := range []time.Duration{2 * time.Millisecond, time.Millisecond, 250 * time.Microsecond, 100 * time.Microsecond} {
		b.Run(fmt.Sprintf("every=%v", every), func(b *testing.B) {
			evs, wall, cli, srv := drive(b, probe.Serve{Name: "srv", TCP: []int{8080}},
				probe.Connect{Name: "cli", Target: "10.99.0.2:8080", Interval: every})
			ok, failed := 0, 0
			for _, e := range evs {
				if e.Kind == probe.KindAttempt {
					if e.Outcome == probe.OK {
						ok++
					} else {
						failed++
					}
				}
			}
			b.ReportMetric(float64(ok)/wall.Seconds(), "conn/s")
			b.ReportMetric(float64(failed), "failed")
			b.ReportMetric(cpuPercent(cli, wall), "probe-cpu-%")
			b.ReportMetric(float64((cli.User+cli.System).Microseconds())/float64(max(ok, 1)), "probe-cpu-µs/conn")
			b.ReportMetric(cpuPercent(srv, wall), "server-cpu-%")
		})
	}
}

// BenchmarkStream reports how many streams a stream probe holds at 5 ms per message,
// the echo rate, and the CPU cost.
func BenchmarkStream(b *testing.B) {
	for _, k := range []int{16, 128, 512} {
		b.Run(fmt.Sprintf("streams=%d", k), func(b *testing.B) {
			evs, wall, cli, srv := drive(b, probe.Serve{Name: "srv", TCP: []int{8080}},
				probe.Stream{Name: "st", Target: "10.99.0.2:8080", Streams: k})
			held, echoes := 0, 0
			var maxGap time.Duration
			for _, e := range evs {
				switch e.Kind {
				case probe.KindOpen:
					if e.Outcome == probe.OK {
						held++
					}
				case probe.KindEnd:
					if e.Outcome != probe.Stopped {
						held--
					}
				case probe.KindEcho:
					echoes += e.Count
					maxGap = max(maxGap, e.Gap)
				}
			}
			b.ReportMetric(float64(held), "streams-held")
			b.ReportMetric(float64(echoes)/wall.Seconds(), "echoes/s")
			b.ReportMetric(float64(maxGap)/1e6, "max-gap-ms")
			b.ReportMetric(cpuPercent(cli, wall), "probe-cpu-%")
			b.ReportMetric(cpuPercent(srv, wall), "server-cpu-%")
		})
	}
}

// BenchmarkUDP reports the datagram rate of a udp probe and its CPU cost.
func BenchmarkUDP(b *testing.B) {
	for _, every := range []time.Duration{time.Millisecond, 100 * time.Microsecond} {
		b.Run(fmt.Sprintf("every=%v", every), func(b *testing.B) {
			evs, wall, cli, srv := drive(b, probe.Serve{Name: "srv", UDP: []int{5000, 5001}},
				probe.UDP{Name: "p", Interval: every, To: []probe.Destination{{Label: "S", Addr: "10.99.0.2:5000"}, {Label: "D", Addr: "10.99.0.2:5001"}}})
			sent := 0
			for _, e := range evs {
				if e.Kind == probe.KindSent && e.Outcome == probe.OK {
					sent++
				}
			}
			b.ReportMetric(float64(sent)/wall.Seconds(), "datagrams/s")
			b.ReportMetric(cpuPercent(cli, wall), "probe-cpu-%")
			b.ReportMetric(cpuPercent(srv, wall), "server-cpu-%")
		})
	}
}
