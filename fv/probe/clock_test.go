package probe_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/clocks"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/internal/privileged"
)

// TestClockExchangeOnOneClock: a probe's clock reading lies between the suite's two
// readings around the exchange, so on one clock the estimate's bound covers zero,
// and the answers never reach the probe's events.
func TestClockExchangeOnOneClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prog, err := probe.Self()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var kinds []probe.Kind
	p, err := probe.Start(ctx, probe.Local{}, prog, probe.Clock{Name: "clock"}, probe.Options{OnEvent: func(e probe.Event) {
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill(ctx)
	est, err := clocks.Measure(ctx, p, 16)
	if err != nil {
		t.Fatal(err)
	}
	if est.Offset < -est.Bound || est.Offset > est.Bound {
		t.Errorf("one clock measured %s: its bound does not cover zero", est)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range kinds {
		if k == probe.KindClock {
			t.Fatalf("a clock answer reached the events: %v", kinds)
		}
	}
}

// inTimeNS starts a command in a new time namespace whose CLOCK_MONOTONIC is offset
// ahead of this machine's (unshare(1) makes it and execs the command into it).
type inTimeNS struct{ offset time.Duration }

func (s inTimeNS) Start(cmd *exec.Cmd) error {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return err
	}
	cmd.Args = append([]string{"unshare", "--time", fmt.Sprintf("--monotonic=%d", int64(s.offset/time.Second)), "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = unshare
	return cmd.Start()
}

// TestClockOfAnotherHost: a server on a clock 1000 s ahead is measured so, within the
// bound, and with the estimate its events land on the suite's clock: a request it
// records arrives after the client (on the suite's clock) sent it, and well within a
// second; left unconverted, 1000 s after.
func TestClockOfAnotherHost(t *testing.T) {
	privileged.Require(t) // a time namespace needs CAP_SYS_ADMIN
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prog, err := probe.Self()
	if err != nil {
		t.Fatal(err)
	}
	const skew = 1000 * time.Second
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	var est clocks.Estimate
	var mu sync.Mutex
	var recv []probe.Event
	convert := func(name string, t monotime.Time) monotime.Time {
		if name != "srv" {
			return t // the client reads the suite's clock
		}
		return est.ToSuite(t)
	}
	srv, err := probe.Start(ctx, inTimeNS{skew}, prog, probe.Serve{Name: "srv", TCP: []int{port}, RecordTCP: true}, probe.Options{Clock: convert, OnEvent: func(e probe.Event) {
		if e.Kind == probe.KindRecv {
			mu.Lock()
			recv = append(recv, e)
			mu.Unlock()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill(ctx)
	if est, err = clocks.Measure(ctx, srv, clocks.Exchanges); err != nil {
		t.Fatal(err)
	}
	if d := est.Offset - skew; d < -est.Bound || d > est.Bound {
		t.Fatalf("measured %s, set %v: off by %v, over the bound", est, skew, d)
	}
	cl, err := probe.Start(ctx, probe.Local{}, prog, probe.Connect{Name: "cl", Target: fmt.Sprintf("127.0.0.1:%d", port), Count: 20, Interval: time.Millisecond}, probe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	<-cl.Done()
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(recv) == 0 {
		t.Fatal("the server recorded no request")
	}
	for _, e := range recv {
		if took := e.End.Sub(e.Time); took < -est.Bound || took > 500*time.Millisecond {
			t.Fatalf("request %d from %s was sent at %d and arrived at %d on the suite's clock: %v later; want a few µs", e.Seq, e.From, e.Time, e.End, took)
		}
	}
}
