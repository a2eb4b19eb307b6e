package probe_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/internal/vethpair"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/internal/specbrief"
)

// TestMain lets the test binary act as the probe: probes are started from
// probe.Self(), which re-executes this binary with probe.EnvChild set.
func TestMain(m *testing.M) {
	probe.RunIfChild()
	os.Exit(m.Run())
}

func TestIntegration(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "fv/probe integration")
}

// Ginkgo shows skip reasons only when verbose: say it out loud once.
var _ = BeforeSuite(func() {
	if why := privileged.Missing(); why != "" && !privileged.Required() {
		fmt.Fprintf(os.Stderr, "\n*** fv/probe: SKIPPING every spec with real traffic: %s; run as root, or set %s=1 to make this a failure ***\n\n", why, privileged.EnvRequire)
	}
})

// lab is a client and a server namespace joined by a veth, a firewall in the server,
// and one timeline for every probe started.
type lab struct {
	pair    *vethpair.Pair
	fw      *vethpair.Firewall
	tl      *timeline.Timeline
	prog    probe.Program
	cleanup func(func() error)
	stderr  io.Writer
}

// newLab builds a lab; cleanup registers what must be undone (last in, first out).
func newLab(ctx context.Context, cleanup func(func() error), stderr io.Writer) (*lab, error) {
	prog, err := probe.Self()
	if err != nil {
		return nil, err
	}
	pair, err := vethpair.New(ctx)
	if err != nil {
		return nil, err
	}
	cleanup(pair.Close)
	fw, err := pair.Server.Firewall()
	if err != nil {
		return nil, err
	}
	cleanup(fw.Close)
	return &lab{pair: pair, fw: fw, tl: timeline.New(), prog: prog, cleanup: cleanup, stderr: stderr}, nil
}

// start starts a probe in side, killed at cleanup if still running.
func (l *lab) start(ctx context.Context, side vethpair.Side, cfg probe.Config) (*probe.Process, error) {
	p, err := probe.Start(ctx, side.Starter(), l.prog, cfg, probe.Options{OnEvent: l.tl.Add, Stderr: l.stderr})
	if err != nil {
		return nil, err
	}
	l.cleanup(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return p.Kill(ctx)
	})
	return p, nil
}

func (l *lab) server(port int) string { return fmt.Sprintf("%s:%d", l.pair.Server.IP, port) }

// blackhole inserts rule at the top of INPUT in the server, keeps it for d from its
// commit, and removes it. It records "<name>-on" and "<name>-off" at the commits.
func (l *lab) blackhole(ctx context.Context, name, rule string, d time.Duration) (on, off vethpair.Applied, err error) {
	on, err = l.fw.Apply(ctx, "-I INPUT "+rule)
	if err != nil {
		return on, off, err
	}
	l.tl.RecordAt(on.Committed, name+"-on", rule)
	time.Sleep(monotime.Until(on.Committed.Add(d)))
	off, err = l.fw.Apply(ctx, "-D INPUT "+rule)
	if err != nil {
		return on, off, err
	}
	l.tl.RecordAt(off.Committed, name+"-off", "")
	return on, off, nil
}

// ginkgoLab builds a lab for the current spec.
func ginkgoLab(ctx context.Context) *lab {
	l, err := newLab(ctx, func(f func() error) {
		DeferCleanup(func() { Expect(f()).To(Succeed()) })
	}, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	return l
}

// mustStart starts a probe or fails the spec.
func (l *lab) mustStart(ctx context.Context, side vethpair.Side, cfg probe.Config) *probe.Process {
	p, err := l.start(ctx, side, cfg)
	Expect(err).NotTo(HaveOccurred())
	return p
}

// stop stops probes cleanly, clients before servers.
func stop(ctx context.Context, ps ...*probe.Process) {
	for _, p := range ps {
		Expect(p.Stop(ctx)).To(Succeed(), "stop %s", p)
	}
}

// report logs what matchers measured, figure next to budget.
func report(ms ...matchers.Matcher) {
	for _, m := range ms {
		r := m.Result()
		for _, f := range r.Figures {
			fmt.Fprintf(GinkgoWriter, "  [%s] %s\n", r.Verdict, f.Text)
		}
	}
}
