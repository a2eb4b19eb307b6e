package probe_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// freePort returns a loopback TCP and UDP port nobody listens on right now.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// These specs run in the caller's own namespace on loopback: no privilege needed.
var _ = Describe("a probe process", func() {
	var prog probe.Program
	var tl *timeline.Timeline
	BeforeEach(func() {
		var err error
		prog, err = probe.Self()
		Expect(err).NotTo(HaveOccurred())
		tl = timeline.New()
	})
	start := func(ctx context.Context, cfg probe.Config) (*probe.Process, error) {
		p, err := probe.Start(ctx, probe.Local{}, prog, cfg, probe.Options{OnEvent: tl.Add, Stderr: GinkgoWriter})
		if p != nil {
			DeferCleanup(func(ctx SpecContext) { Expect(p.Kill(ctx)).To(Succeed()) }, NodeTimeout(10*time.Second))
		}
		return p, err
	}

	It("reports a missing binary clearly", func(ctx SpecContext) {
		_, err := probe.Start(ctx, probe.Local{}, probe.Binary("/nonexistent/dpconform"), probe.Serve{Name: "s", TCP: []int{1}}, probe.Options{})
		Expect(err).To(MatchError(probe.ErrProbe))
		Expect(err.Error()).To(And(ContainSubstring("start probe serve s (/nonexistent/dpconform)"), ContainSubstring("no such file or directory")))
	}, NodeTimeout(10*time.Second))

	It("reports a probe that dies before it is ready, with its stderr", func(ctx SpecContext) {
		port := freePort()
		first, err := start(ctx, probe.Serve{Name: "one", TCP: []int{port}})
		Expect(err).NotTo(HaveOccurred())
		_, err = start(ctx, probe.Serve{Name: "two", TCP: []int{port}})
		Expect(err).To(MatchError(probe.ErrProbe))
		Expect(err.Error()).To(And(ContainSubstring("probe serve two exited before it was ready"), ContainSubstring("exit status 1"), ContainSubstring("address already in use")))
		Expect(first.Stop(ctx)).To(Succeed())
	}, NodeTimeout(10*time.Second))

	It("stops cleanly on request, ending with done and a clean exit", func(ctx SpecContext) {
		port := freePort()
		srv, err := start(ctx, probe.Serve{Name: "srv", TCP: []int{port}})
		Expect(err).NotTo(HaveOccurred())
		cli, err := start(ctx, probe.Connect{Name: "cli", Target: net.JoinHostPort("127.0.0.1", itoa(port))})
		Expect(err).NotTo(HaveOccurred())
		time.Sleep(200 * time.Millisecond)
		t := monotime.Now()
		Expect(cli.WaitMark(ctx, t)).To(Succeed())
		Expect(cli.Stop(ctx)).To(Succeed())
		Expect(srv.Stop(ctx)).To(Succeed())
		evs := cli.Events()
		Expect(evs[len(evs)-2].Kind).To(Equal(probe.KindDone))
		Expect(evs[len(evs)-1]).To(And(HaveField("Kind", probe.KindExit), HaveField("Outcome", probe.OK)))
		u, ok := cli.Usage()
		Expect(ok).To(BeTrue())
		Expect(u.User + u.System).To(BeNumerically(">", 0))
		Expect(tl.Whole()).To(HaveField("Events", ContainElement(HaveField("Probe", "cli"))))
	}, NodeTimeout(20*time.Second))

	It("reports a crash with the exit status and stderr, on the timeline too", func(ctx SpecContext) {
		srv, err := start(ctx, probe.Serve{Name: "srv", TCP: []int{freePort()}})
		Expect(err).NotTo(HaveOccurred())
		Expect(syscall.Kill(srv.PID(), syscall.SIGABRT)).To(Succeed())
		Eventually(srv.Done()).WithContext(ctx).Should(BeClosed())
		Expect(srv.Err()).To(MatchError(probe.ErrProbe))
		Expect(srv.Err().Error()).To(And(ContainSubstring("probe serve srv"), ContainSubstring("SIGABRT")))
		evs := tl.Whole().Events
		Expect(evs[len(evs)-1]).To(And(HaveField("Kind", probe.KindExit), HaveField("Outcome", probe.Crashed)))
		Expect(errors.Is(srv.Stop(ctx), probe.ErrProbe)).To(BeTrue())
	}, NodeTimeout(10*time.Second))

	It("marks a killed probe as killed", func(ctx SpecContext) {
		srv, err := start(ctx, probe.Serve{Name: "srv", UDP: []int{freePort()}})
		Expect(err).NotTo(HaveOccurred())
		Expect(srv.Kill(ctx)).To(Succeed())
		Expect(srv.Err()).To(MatchError(ContainSubstring("was killed")))
		evs := srv.Events()
		Expect(evs[len(evs)-1]).To(HaveField("Outcome", probe.Killed))
	}, NodeTimeout(10*time.Second))

	It("ends when its stdin closes, as when the suite dies", func(ctx SpecContext) {
		srv, err := start(ctx, probe.Serve{Name: "srv", UDP: []int{freePort()}})
		Expect(err).NotTo(HaveOccurred())
		Expect(srv.Command("stop")).To(Succeed())
		Eventually(srv.Done()).WithContext(ctx).Should(BeClosed())
		Expect(srv.Err()).NotTo(HaveOccurred())
	}, NodeTimeout(10*time.Second))
})

func itoa(n int) string { return (&net.TCPAddr{Port: n}).String()[1:] }
