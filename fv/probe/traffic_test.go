package probe_test

import (
	"fmt"
	"sort"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/internal/privileged"
)

// These specs prove the instrument with real traffic between two network namespaces:
// it catches what it must catch, classifies it right, and raises no false alarm.
var _ = Describe("the probes on a real path", Label("privileged"), func() {
	var l *lab
	// pauseFor stops the process pid for d (SIGSTOP, then SIGCONT), recording
	// who-stopped and who-continued, and returns when it was stopped.
	pauseFor := func(pid int, who string, d time.Duration) monotime.Time {
		GinkgoHelper()
		stopped := l.tl.Record(who+"-stopped", "SIGSTOP")
		Expect(syscall.Kill(pid, syscall.SIGSTOP)).To(Succeed())
		time.Sleep(d)
		Expect(syscall.Kill(pid, syscall.SIGCONT)).To(Succeed())
		l.tl.Record(who+"-continued", "SIGCONT")
		return stopped
	}
	BeforeEach(func(ctx SpecContext) {
		privileged.Ginkgo(Skip, Fail)
		l = ginkgoLab(ctx)
	}, NodeTimeout(30*time.Second))

	serve := func(ctx SpecContext, cfg probe.Serve) *probe.Process {
		return l.mustStart(ctx, l.pair.Server, cfg)
	}

	It("answers connects through the veth with the server's identity", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		cli := l.mustStart(ctx, l.pair.Client, probe.Connect{Name: "ext", Target: l.server(8080), Count: 100})
		Eventually(cli.Done()).WithContext(ctx).WithTimeout(10 * time.Second).Should(BeClosed())
		Expect(cli.Err()).NotTo(HaveOccurred())
		stop(ctx, srv)
		evs := cli.Events()
		m := matchers.HaveNoFailedAttempts(matchers.Backends("pod-a"))
		Expect(l.tl.Window(evs[0].Time, evs[len(evs)-3].Time)).To(m) // from ready to the last attempt's report
		Expect(m.Result().Figures[0].Of).To(Equal(100))
	}, NodeTimeout(30*time.Second))

	It("catches a 10 ms blackhole at 2 ms in at least 95 of 100 tries, and a 50 ms one in every try", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		cli := l.mustStart(ctx, l.pair.Client, probe.Connect{Name: "ext", Target: l.server(8080), Interval: 2 * time.Millisecond})
		time.Sleep(200 * time.Millisecond)

		type try struct {
			hole    time.Duration
			on, off monotime.Time // window bounds: from before the rule to after its removal
			lo, hi  time.Duration // bounds of the blackhole's true length
		}
		var tries []try
		run := func(hole time.Duration, n int) {
			for i := 0; i < n; i++ {
				on, off, err := l.blackhole(ctx, fmt.Sprintf("hole%d", len(tries)+1), "-p tcp --dport 8080 -j DROP", hole)
				Expect(err).NotTo(HaveOccurred())
				tries = append(tries, try{hole, on.Sent.Add(-2 * time.Millisecond), off.Committed.Add(2 * time.Millisecond),
					off.Sent.Sub(on.Committed), off.Committed.Sub(on.Sent)})
				time.Sleep(200 * time.Millisecond)
			}
		}
		run(10*time.Millisecond, 100)
		run(50*time.Millisecond, 10)
		time.Sleep(1200 * time.Millisecond) // attempts of the last holes time out
		end := monotime.Now()
		stop(ctx, cli, srv)

		caught := map[time.Duration]int{}
		var lows, highs []time.Duration
		var clean []string
		for i, t := range tries {
			w := l.tl.Window(t.on, t.off)
			m := matchers.HaveNoFailedAttempts()
			ok, err := m.Match(w)
			Expect(err).NotTo(HaveOccurred())
			if !ok {
				if caught[t.hole] == 0 {
					fmt.Fprintf(GinkgoWriter, "the first caught %v hole, as a spec would report it:\n%s\n", t.hole, m.FailureMessage(w))
				}
				caught[t.hole]++
				Expect(m.Result().Figures[2].Value).To(Equal(m.Result().Figures[0].Value), "a DROP makes timeouts only:\n%s", m.FailureMessage(w))
			} else {
				fmt.Fprintf(GinkgoWriter, "try %d (%v hole, %v..%v) not caught: %s\n", i+1, t.hole, t.lo, t.hi, m.Result().Figures[0].Text)
			}
			if t.hole == 10*time.Millisecond {
				lows, highs = append(lows, t.lo), append(highs, t.hi)
			}
			// Between two holes nothing may fail: no false alarm.
			next := end
			if i+1 < len(tries) {
				next = tries[i+1].on
			}
			quiet := l.tl.Window(t.off, next)
			if m := matchers.HaveNoFailedAttempts(); !Expect(m.Match(quiet)).Error().NotTo(HaveOccurred()) || m.Result().Verdict != matchers.Pass {
				clean = append(clean, fmt.Sprintf("after try %d: %s", i+1, m.FailureMessage(quiet)))
			}
		}
		sort.Slice(lows, func(i, j int) bool { return lows[i] < lows[j] })
		sort.Slice(highs, func(i, j int) bool { return highs[i] < highs[j] })
		fmt.Fprintf(GinkgoWriter, "10 ms holes: true length between %v (median lower bound) and %v (median upper bound); caught %d of 100; 50 ms holes caught %d of 10\n",
			lows[len(lows)/2], highs[len(highs)/2], caught[10*time.Millisecond], caught[50*time.Millisecond])
		AddReportEntry("blackhole catch rate", fmt.Sprintf("10ms: %d/100, 50ms: %d/10", caught[10*time.Millisecond], caught[50*time.Millisecond]))
		Expect(caught[10*time.Millisecond]).To(BeNumerically(">=", 95))
		Expect(caught[50*time.Millisecond]).To(Equal(10))
		Expect(clean).To(BeEmpty(), "failures outside the blackholes (false alarms)")
	}, NodeTimeout(3*time.Minute))

	It("classifies injected RSTs as reset or refused, never as timeouts", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		cli := l.mustStart(ctx, l.pair.Client, probe.Connect{Name: "ext", Target: l.server(8080)})
		time.Sleep(100 * time.Millisecond)
		// A RST in answer to the SYN: ECONNREFUSED.
		syn, synOff, err := l.blackhole(ctx, "rst-syn", "-p tcp --dport 8080 -j REJECT --reject-with tcp-reset", 50*time.Millisecond)
		Expect(err).NotTo(HaveOccurred())
		time.Sleep(100 * time.Millisecond)
		// A RST on the established connection (the SYN passes): ECONNRESET.
		est, estOff, err := l.blackhole(ctx, "rst-est", "-p tcp --dport 8080 ! --syn -j REJECT --reject-with tcp-reset", 50*time.Millisecond)
		Expect(err).NotTo(HaveOccurred())
		time.Sleep(1200 * time.Millisecond)
		stop(ctx, cli, srv)

		for _, c := range []struct {
			name    string
			from    monotime.Time
			to      monotime.Time
			outcome probe.Outcome
		}{{"RST to the SYN", syn.Sent, synOff.Committed, probe.Refused}, {"RST when established", est.Sent, estOff.Committed, probe.Reset}} {
			By(c.name)
			w := l.tl.Window(c.from, c.to)
			m := matchers.HaveNoFailedAttempts()
			Expect(w).NotTo(m)
			report(m)
			figs := m.Result().Figures
			Expect(figs[0].Value).To(BeNumerically(">=", 10), "failed attempts")
			Expect(figs[1].Value).To(Equal(figs[0].Value), "every failure is a reset or refusal:\n%s", m.FailureMessage(w))
			Expect(figs[2].Value).To(BeZero(), "no timeout")
			var outcomes = map[probe.Outcome]int{}
			for _, e := range w.Inside() {
				if e.Kind == probe.KindAttempt && e.Outcome.Failed() {
					outcomes[e.Outcome]++
				}
			}
			Expect(outcomes).To(HaveKey(c.outcome))
			Expect(w).NotTo(matchers.HaveNoResets())
		}
		// Between the rules nothing fails. The window ends 10 ms before the second rule
		// is sent: an attempt started just before it is still in its handshake when the
		// rule lands, and is rightly reset.
		Expect(l.tl.Window(synOff.Committed.Add(5*time.Millisecond), est.Sent.Add(-10*time.Millisecond))).To(matchers.HaveNoFailedAttempts())
	}, NodeTimeout(30*time.Second))

	It("holds answered connections until it stops, and reports each as alive or lost, and how", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		cfg := probe.Connect{Target: l.server(8080), Interval: 10 * time.Millisecond, Timeout: 500 * time.Millisecond, Hold: true}
		cfg.Name = "kept"
		kept := l.mustStart(ctx, l.pair.Client, cfg)
		cfg.Name = "lost"
		lost := l.mustStart(ctx, l.pair.Client, cfg)
		time.Sleep(300 * time.Millisecond)
		from := monotime.Now()
		time.Sleep(200 * time.Millisecond)
		// Released: what it opens from now on, it does not hold.
		Expect(kept.Release()).To(Succeed())
		time.Sleep(100 * time.Millisecond)
		to := monotime.Now()
		stop(ctx, kept)
		// The server's stack now answers every segment of an established
		// connection with a RST: the held connections of the other probe are lost.
		rule := "-p tcp --dport 8080 ! --syn -j REJECT --reject-with tcp-reset"
		_, err := l.fw.Apply(ctx, "-I INPUT "+rule)
		Expect(err).NotTo(HaveOccurred())
		stop(ctx, lost)
		_, err = l.fw.Apply(ctx, "-D INPUT "+rule)
		Expect(err).NotTo(HaveOccurred())
		stop(ctx, srv)

		w := l.tl.Window(from, to)
		alive := matchers.HaveAllHeldAlive(matchers.Probes("kept"))
		Expect(w).To(alive)
		report(alive)
		Expect(alive.Result().Figures[0].Of).To(BeNumerically(">=", 15), "connections held")
		var heldN, attempts int
		for _, e := range kept.Events() {
			switch {
			case e.Kind == probe.KindHeld:
				heldN++
			case e.Kind == probe.KindAttempt && e.Outcome == probe.OK:
				attempts++
			}
		}
		Expect(heldN).To(BeNumerically("<=", attempts-5), "the connections opened after the release are not held")
		dead := matchers.HaveAllHeldAlive(matchers.Probes("lost"))
		Expect(w).NotTo(dead)
		report(dead)
		Expect(dead.Result().Kind).To(Equal(matchers.KindReset), dead.FailureMessage(w))
		Expect(dead.Result().Figures[0].Value).To(Equal(float64(dead.Result().Figures[0].Of)), "every held connection lost")
		// The attempts themselves were all answered: losing a held flow is not a
		// failed attempt.
		Expect(w).To(matchers.HaveNoFailedAttempts())
	}, NodeTimeout(30*time.Second))

	It("shows a 300 ms drop on streams as a gap over 250 ms, with no reset", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		st := l.mustStart(ctx, l.pair.Client, probe.Stream{Name: "st", Target: l.server(8080), Streams: 4})
		time.Sleep(500 * time.Millisecond)
		on, off, err := l.blackhole(ctx, "drop", "-p tcp --dport 8080 -j DROP", 300*time.Millisecond)
		Expect(err).NotTo(HaveOccurred())
		time.Sleep(2 * time.Second)
		end := monotime.Now()
		stop(ctx, st, srv)
		w := l.tl.Window(on.Committed.Add(-400*time.Millisecond), end)
		gaps := matchers.HaveStreamGapsWithin(250 * time.Millisecond)
		Expect(w).NotTo(gaps)
		fmt.Fprintln(GinkgoWriter, gaps.FailureMessage(w))
		Expect(gaps.Result().Figures[0].Value).To(BeNumerically(">=", 250))
		Expect(gaps.Result().Figures[0].Value).To(BeNumerically(">=", float64(off.Sent.Sub(on.Committed))/1e6), "the gap covers the whole drop")
		resets, alive := matchers.HaveNoResets(), matchers.BeAliveAtEnd()
		Expect(w).To(resets)
		Expect(w).To(alive)
		report(gaps, resets, alive)
		for _, e := range st.Events() {
			Expect(e.Kind).NotTo(Equal(probe.KindStall), "a drop on the path is not the probe's own stall: %+v", e)
		}
		// A gap counts whole when it overlaps a window, and this one starts at the last
		// echo before the drop: end the quiet window well before it.
		Expect(l.tl.Window(on.Committed.Add(-400*time.Millisecond), on.Sent.Add(-20*time.Millisecond))).To(matchers.HaveStreamGapsWithin(200*time.Millisecond), "no gap before the drop")
	}, NodeTimeout(30*time.Second))

	// The machine not running the probe is not the path's gap: the probe says so, and
	// past the instrument limit the check cannot be judged.
	It("reports its own stall on streams, and a gap it explains is not the path's", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		st := l.mustStart(ctx, l.pair.Client, probe.Stream{Name: "st", Target: l.server(8080), Streams: 3})
		time.Sleep(500 * time.Millisecond)
		stopped := pauseFor(st.PID(), "probe", 300*time.Millisecond)
		time.Sleep(time.Second)
		end := monotime.Now()
		stop(ctx, st, srv)
		// The stop's stall on every stream; a shorter one (a loaded machine's) is no
		// concern of this test.
		stalled := map[int]int{}
		for _, e := range st.Events() {
			if e.Kind == probe.KindStall && e.Gap >= 250*time.Millisecond {
				stalled[e.Stream]++
			}
		}
		Expect(stalled).To(Equal(map[int]int{1: 1, 2: 1, 3: 1}), "the stop's stall, once on every stream")
		w := l.tl.Window(stopped.Add(-400*time.Millisecond), end)
		gaps := matchers.HaveStreamGapsWithin(200 * time.Millisecond)
		Expect(gaps.Match(w)).Error().To(MatchError(ContainSubstring("the instrument was blind")))
		Expect(w).To(matchers.HaveStreamGapsWithin(200*time.Millisecond, matchers.MaxBlind(time.Second)),
			"with a limit above the stall, the gap is the probe's, not the path's")
	}, NodeTimeout(30*time.Second))

	// The echo server not running is the instrument's gap too: the server says so.
	It("reports its echo server's stall, and a gap it explains is not the path's", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		st := l.mustStart(ctx, l.pair.Client, probe.Stream{Name: "st", Target: l.server(8080), Streams: 3})
		time.Sleep(500 * time.Millisecond)
		stopped := pauseFor(srv.PID(), "server", 300*time.Millisecond)
		time.Sleep(time.Second)
		end := monotime.Now()
		stop(ctx, st, srv)
		// The stop's stall, once; a shorter one (a loaded machine's) is no concern of
		// this test.
		var stalls []probe.Event
		for _, e := range srv.Events() {
			if e.Kind == probe.KindServerStall && e.Gap >= 250*time.Millisecond {
				stalls = append(stalls, e)
			}
		}
		Expect(stalls).To(HaveLen(1), "one stall of the server")
		Expect(stalls[0].Probe).To(Equal("pod-a"))
		gapped := map[int]bool{}
		for _, e := range st.Events() {
			if e.Kind == probe.KindStall {
				Expect(e.Gap).To(BeNumerically("<", 250*time.Millisecond), "the server's stall is not the client's: %+v", e)
			}
			if e.Kind == probe.KindGap && e.Gap >= 250*time.Millisecond {
				gapped[e.Stream] = true
			}
		}
		Expect(gapped).To(HaveLen(3), "a gap on every stream")
		w := l.tl.Window(stopped.Add(-400*time.Millisecond), end)
		gaps := matchers.HaveStreamGapsWithin(200 * time.Millisecond)
		Expect(gaps.Match(w)).Error().To(MatchError(ContainSubstring("its echo server pod-a did not run")))
		Expect(w).To(matchers.HaveStreamGapsWithin(200*time.Millisecond, matchers.MaxBlind(time.Second)),
			"with a limit above the stall, the gap is the server's, not the path's")
	}, NodeTimeout(30*time.Second))

	It("shows a reset on streams whose server process is killed", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		st := l.mustStart(ctx, l.pair.Client, probe.Stream{Name: "st", Target: l.server(8080), Streams: 3})
		time.Sleep(300 * time.Millisecond)
		killed := l.tl.Record("server-killed", "SIGKILL")
		Expect(srv.Kill(ctx)).To(Succeed())
		Eventually(func() int {
			n := 0
			for _, e := range st.Events() {
				if e.Kind == probe.KindEnd {
					n++
				}
			}
			return n
		}).WithContext(ctx).WithTimeout(5 * time.Second).Should(Equal(3))
		Expect(st.WaitMark(ctx, killed.Add(500*time.Millisecond))).To(Succeed())
		stop(ctx, st)
		w := l.tl.Window(killed.Add(-time.Second), killed.Add(500*time.Millisecond))
		resets, alive := matchers.HaveNoResets(), matchers.BeAliveAtEnd()
		Expect(w).NotTo(resets)
		Expect(w).NotTo(alive)
		fmt.Fprintln(GinkgoWriter, resets.FailureMessage(w))
		Expect(resets.Result().Figures[0].Value).To(Equal(3.0))
		Expect(resets.Result().First).To(ContainSubstring("RESET"))
		Expect(alive.Result().First).To(ContainSubstring("RESET"))
		for _, e := range w.Inside() {
			if e.Kind == probe.KindExit {
				Expect(e.Outcome).To(Equal(probe.Killed))
			}
		}
	}, NodeTimeout(30*time.Second))

	// A dataplane that resets the flows to a vanished backend resets one when the
	// client's next packet comes by. Here the retransmissions came ~1.6 s after the
	// path went and then, with the kernel's exponential backoff, ~3.3 s: resets from
	// 1.8 s on were learnt ~1.5 s late. With the cap the next came ~2.6 s.
	It("learns of a reset on a stream whose path went black within the retransmission cap", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}})
		st := l.mustStart(ctx, l.pair.Client, probe.Stream{Name: "st", Target: l.server(8080), Streams: 2})
		time.Sleep(300 * time.Millisecond)
		// Both ways, as for a backend that vanished: its own retransmissions would
		// draw the client's acknowledgements.
		_, err := l.fw.Apply(ctx, "-I OUTPUT -p tcp --sport 8080 -j DROP")
		Expect(err).NotTo(HaveOccurred())
		drop, err := l.fw.Apply(ctx, "-I INPUT -p tcp --dport 8080 -j DROP")
		Expect(err).NotTo(HaveOccurred())
		l.tl.RecordAt(drop.Committed, "path-black", "")
		time.Sleep(monotime.Until(drop.Committed.Add(1800 * time.Millisecond)))
		_, err = l.fw.Apply(ctx, "-I OUTPUT -p tcp --sport 8080 --tcp-flags RST RST -j ACCEPT")
		Expect(err).NotTo(HaveOccurred())
		rst, err := l.fw.Apply(ctx, "-I INPUT -p tcp --dport 8080 -j REJECT --reject-with tcp-reset")
		Expect(err).NotTo(HaveOccurred())
		l.tl.RecordAt(rst.Committed, "resets-on", "")
		var ends []probe.Event
		Eventually(func() int {
			ends = ends[:0]
			for _, e := range st.Events() {
				if e.Kind == probe.KindEnd {
					ends = append(ends, e)
				}
			}
			return len(ends)
		}).WithContext(ctx).WithTimeout(5 * time.Second).Should(Equal(2))
		stop(ctx, st, srv)
		for _, e := range ends {
			fmt.Fprintf(GinkgoWriter, "stream %d: %s %.1f ms after the resets began, %.1f ms after the path went\n",
				e.Stream, e.Outcome, float64(e.Time.Sub(rst.Committed))/1e6, float64(e.Time.Sub(drop.Committed))/1e6)
			Expect(e.Outcome).To(Equal(probe.Reset), e.Err)
			Expect(e.Time.Sub(rst.Committed)).To(BeNumerically("<", probe.MaxRetransmitInterval+150*time.Millisecond),
				"the stream learnt of the reset only at a retransmission past the cap")
		}
	}, NodeTimeout(30*time.Second))

	It("sees nothing delivered on a denied flow, and the first delivery once allowed", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{9090}, UDP: []int{5002}, RecordTCP: true})
		_, err := l.fw.Apply(ctx, "-I INPUT -p tcp --dport 9090 -j DROP", "-I INPUT -p udp --dport 5002 -j DROP")
		Expect(err).NotTo(HaveOccurred())
		cli := l.mustStart(ctx, l.pair.Client, probe.Connect{Name: "p", Target: l.server(9090), Timeout: 300 * time.Millisecond})
		udp := l.mustStart(ctx, l.pair.Client, probe.UDP{Name: "p-udp", Interval: 2 * time.Millisecond, To: []probe.Destination{{Label: "X", Addr: l.server(5002)}}})
		time.Sleep(500 * time.Millisecond)
		allowed, err := l.fw.Apply(ctx, "-D INPUT -p tcp --dport 9090 -j DROP", "-D INPUT -p udp --dport 5002 -j DROP")
		Expect(err).NotTo(HaveOccurred())
		l.tl.RecordAt(allowed.Committed, "allowed", "DROP removed")
		time.Sleep(300 * time.Millisecond)
		end := monotime.Now()
		stop(ctx, cli, udp)
		Expect(srv.WaitMark(ctx, end.Add(matchers.DefaultGrace))).To(Succeed())
		stop(ctx, srv)

		denied := l.tl.Window(allowed.Sent.Add(-400*time.Millisecond), allowed.Sent)
		zero := matchers.HaveZeroDelivered()
		Expect(denied).To(zero)
		report(zero)
		Expect(zero.Result().Figures[0].Of).To(BeNumerically(">", 300))

		w := l.tl.Window(allowed.Sent.Add(-400*time.Millisecond), end)
		leak := matchers.HaveZeroDelivered()
		Expect(w).NotTo(leak)
		Expect(leak.Result().First).To(ContainSubstring("allowed"), "the first delivery is placed relative to the transition")
		// The rule goes between sending the change and the kernel announcing its
		// commit: no delivery may have been sent before the change was (a little
		// slack for an attempt started just before whose SYN left just after).
		var first monotime.Time
		for _, e := range w.Inside() {
			if e.Kind == probe.KindRecv {
				first = e.Time
				break
			}
		}
		Expect(first).To(BeNumerically(">=", allowed.Sent.Add(-2*time.Millisecond)), "first delivery %s", w.Relative(first))
		fmt.Fprintln(GinkgoWriter, leak.FailureMessage(w))
	}, NodeTimeout(30*time.Second))

	It("checks UDP delivery to S once D is reached, in both orders", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "srv", UDP: []int{5000, 5001}})
		run := func(name string, blocked int) timeline.Window {
			rule := fmt.Sprintf("-p udp --dport %d -j DROP", blocked)
			_, err := l.fw.Apply(ctx, "-I INPUT "+rule)
			Expect(err).NotTo(HaveOccurred())
			from := monotime.Now()
			p := l.mustStart(ctx, l.pair.Client, probe.UDP{Name: name, To: []probe.Destination{{Label: "S", Addr: l.server(5000)}, {Label: "D", Addr: l.server(5001)}}})
			time.Sleep(200 * time.Millisecond)
			open, err := l.fw.Apply(ctx, "-D INPUT "+rule)
			Expect(err).NotTo(HaveOccurred())
			l.tl.RecordAt(open.Committed, fmt.Sprintf("%s-opened-%d", name, blocked), "")
			time.Sleep(200 * time.Millisecond)
			to := monotime.Now()
			stop(ctx, p)
			Expect(srv.WaitMark(ctx, to.Add(matchers.DefaultGrace))).To(Succeed())
			return l.tl.Window(from, to)
		}
		late := run("s-late", 5000)   // S opens 200 ms after D: S is lost while D gets through
		early := run("s-early", 5001) // D opens 200 ms after S: nothing to S is lost
		stop(ctx, srv)

		bad := matchers.DeliverToOnceDeliveredTo("S", "D", matchers.Probes("s-late"))
		Expect(late).NotTo(bad)
		fmt.Fprintln(GinkgoWriter, bad.FailureMessage(late))
		Expect(bad.Result().Verdict).To(Equal(matchers.Violation))
		Expect(bad.Result().Figures[0].Value).To(BeNumerically(">=", 50))
		good := matchers.DeliverToOnceDeliveredTo("S", "D", matchers.Probes("s-early"))
		Expect(early).To(good)
		report(bad, good)
	}, NodeTimeout(30*time.Second))

	It("sends UDP from the first possible packet, reporting what could not leave", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "srv", UDP: []int{5000}})
		Expect(l.pair.SetUp(l.pair.Client, false)).To(Succeed())
		p := l.mustStart(ctx, l.pair.Client, probe.UDP{Name: "p", To: []probe.Destination{{Label: "S", Addr: l.server(5000)}}})
		time.Sleep(100 * time.Millisecond)
		Expect(l.pair.SetUp(l.pair.Client, true)).To(Succeed())
		up := l.tl.Record("link-up", "")
		time.Sleep(200 * time.Millisecond)
		end := monotime.Now()
		stop(ctx, p)
		Expect(srv.WaitMark(ctx, end.Add(matchers.DefaultGrace))).To(Succeed())
		stop(ctx, srv)

		unreachable, firstOK := 0, monotime.Time(0)
		for _, e := range p.Events() {
			if e.Kind != probe.KindSent {
				continue
			}
			switch {
			case e.Outcome == probe.Unreachable:
				Expect(e.Time).To(BeNumerically("<", up))
				unreachable++
			case e.Outcome == probe.OK && firstOK == 0:
				firstOK = e.Time
			}
		}
		var firstRecv monotime.Time
		for _, e := range srv.Events() {
			if e.Kind == probe.KindRecv && firstRecv == 0 {
				firstRecv = e.Time
			}
		}
		fmt.Fprintf(GinkgoWriter, "%d datagrams unreachable before the link came up; first sent %s, first delivered %s\n",
			unreachable, l.tl.Window(0, 0).Relative(firstOK), l.tl.Window(0, 0).Relative(firstRecv))
		Expect(unreachable).To(BeNumerically(">=", 50))
		Expect(firstRecv.Sub(up)).To(BeNumerically("<", 20*time.Millisecond), "delivered from the first packet possible")
	}, NodeTimeout(30*time.Second))

	It("raises no false alarm in 30 s of probing a clean path", func(ctx SpecContext) {
		srv := serve(ctx, probe.Serve{Name: "pod-a", TCP: []int{8080}, UDP: []int{5000, 5001}})
		cli := l.mustStart(ctx, l.pair.Client, probe.Connect{Name: "ext", Target: l.server(8080)})
		st := l.mustStart(ctx, l.pair.Client, probe.Stream{Name: "st", Target: l.server(8080), Streams: 8})
		udp := l.mustStart(ctx, l.pair.Client, probe.UDP{Name: "p", To: []probe.Destination{{Label: "S", Addr: l.server(5000)}, {Label: "D", Addr: l.server(5001)}}})
		start := l.tl.Record("probing", "")
		time.Sleep(30 * time.Second)
		end := monotime.Now()
		stop(ctx, cli, st, udp)
		Expect(srv.WaitMark(ctx, end.Add(matchers.DefaultGrace))).To(Succeed())
		stop(ctx, srv)
		w := l.tl.Window(start, end)
		ms := []matchers.Matcher{
			matchers.HaveNoFailedAttempts(matchers.Backends("pod-a")),
			matchers.HaveStreamGapsWithin(200 * time.Millisecond),
			matchers.HaveNoResets(),
			matchers.BeAliveAtEnd(),
			matchers.DeliverToOnceDeliveredTo("S", "D"),
		}
		for _, m := range ms {
			Expect(w).To(m)
		}
		report(ms...)
		Expect(ms[0].Result().Figures[0].Of).To(BeNumerically(">", 10000), "attempts in 30 s at 2 ms")
	}, NodeTimeout(2*time.Minute))
})
