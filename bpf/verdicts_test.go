package bpf

import (
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// verdicts opens the test datapath's pinned ring buffer of verdicts, as a
// reader in another process would, and drains what is already there.
func verdicts(t *testing.T, d *Datapath) *VerdictReader {
	t.Helper()
	r, err := OpenVerdicts(d.PinDir())
	must(t, err)
	t.Cleanup(func() { r.Close() })
	_, err = r.Drain()
	must(t, err)
	return r
}

// monotonicNow is bpf_ktime_get_ns() as seen from user space.
func monotonicNow(t *testing.T) uint64 {
	t.Helper()
	var ts unix.Timespec
	must(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	return uint64(ts.Nano())
}

// flow is the tuple of a packet, as a verdict names it.
func flow(p packet) ConntrackKey {
	return ConntrackKey{Src: p.Src.Addr(), Dst: p.Dst.Addr(), SrcPort: p.Src.Port(), DstPort: p.Dst.Port(), Proto: p.Proto}
}

func deny(dir Direction, reason VerdictReason, p packet) Verdict {
	return Verdict{Flow: flow(p), Action: VerdictDeny, Dir: dir, Reason: reason, Ifindex: testIfindex}
}

func allow(dir Direction, p packet) Verdict {
	return Verdict{Flow: flow(p), Action: VerdictAllow, Dir: dir, Reason: ReasonRuleMatched, Ifindex: testIfindex}
}

// expectVerdicts drains r and checks that it holds want, in order, each
// stamped since the CLOCK_MONOTONIC reading since.
func expectVerdicts(t *testing.T, what string, r *VerdictReader, since uint64, want ...Verdict) {
	t.Helper()
	got, err := r.Drain()
	must(t, err)
	until := monotonicNow(t)
	for i := range got {
		if got[i].TimeNs < since || got[i].TimeNs > until {
			t.Errorf("%s: verdict %s stamped %d, outside %d..%d", what, got[i], got[i].TimeNs, since, until)
		}
		got[i].TimeNs = 0
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: verdicts\n\t%v\nwant\n\t%v", what, got, want)
	}
}

func TestVerdictsIngress(t *testing.T) {
	d := setup(t, Options{})
	r := verdicts(t, d)
	ipset(t, d, 5, []string{"10.200.0.2/32"})
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true, Ingress: []PolicyRule{{SetID: 5}}}))

	// One allow for an admitted flow, at its first packet only; nothing for
	// its other packets or the pod's replies.
	t0 := monotonicNow(t)
	syn := tcp(client, pod, tcpSYN)
	expectVerdict(t, "member's SYN", toPod(t, d, syn), tcActOK)
	expectVerdicts(t, "member's SYN", r, t0, allow(Ingress, syn))
	expectVerdict(t, "its ACK", toPod(t, d, tcp(client, pod, tcpACK)), tcActOK)
	expectVerdict(t, "the pod's reply", run(t, d.objs.TcEpIngress, tcp(pod, client, tcpSYN|tcpACK).Bytes(), 0).Ret, tcActOK)
	expectVerdicts(t, "the rest of the flow", r, t0)

	// A deny for each packet dropped: the SYN and its retransmission.
	t0 = monotonicNow(t)
	denied := tcp(outsider, pod, tcpSYN)
	expectVerdict(t, "non-member's SYN", toPod(t, d, denied), tcActShot)
	expectVerdict(t, "its retransmission", toPod(t, d, denied), tcActShot)
	expectVerdicts(t, "non-member's SYNs", r, t0, deny(Ingress, ReasonNoMatch, denied), deny(Ingress, ReasonNoMatch, denied))

	// Without rules, in UDP; the pod's reply on the flow it did not admit
	// is dropped and reported too, as the reply.
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true}))
	t0 = monotonicNow(t)
	u := udp(outsider, pod)
	expectVerdict(t, "UDP", toPod(t, d, u), tcActShot)
	reply := udp(pod, outsider)
	expectVerdict(t, "the pod's reply", run(t, d.objs.TcEpIngress, reply.Bytes(), 0).Ret, tcActShot)
	expectVerdicts(t, "UDP without rules", r, t0, deny(Ingress, ReasonNoRules, u), deny(Ingress, ReasonNotAdmitted, reply))

	// The flow admitted before still passes, and is not reported again.
	expectVerdict(t, "the admitted flow, now without rules", toPod(t, d, tcp(client, pod, tcpACK)), tcActOK)
	expectVerdicts(t, "the admitted flow", r, t0)
}

// Egress verdicts name the backend, as policy judged the flow, not the
// frontend the pod sent to.
func TestVerdictsEgress(t *testing.T) {
	d := setup(t, Options{})
	r := verdicts(t, d)
	service(t, d, clusterIP, TCP, 1, remotePod)
	ipset(t, d, 7, []string{"10.244.1.10/32"}) // remotePod
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{EgressIsolated: true, Egress: []PolicyRule{{SetID: 7}}}))

	t0 := monotonicNow(t)
	syn := tcp(clientPod, clusterIP, tcpSYN)
	expectVerdict(t, "SYN to the frontend", run(t, d.objs.TcEpIngress, syn.Bytes(), 0).Ret, tcActOK)
	expectVerdict(t, "its ACK", run(t, d.objs.TcEpIngress, tcp(clientPod, clusterIP, tcpACK).Bytes(), 0).Ret, tcActOK)
	expectVerdict(t, "the backend's reply", run(t, d.objs.TcEpEgress, tcp(remotePod, clientPod, tcpSYN|tcpACK).Bytes(), 0).Ret, tcActOK)
	expectVerdicts(t, "a flow to an allowed backend", r, t0, allow(Egress, tcp(clientPod, remotePod, tcpSYN)))

	t0 = monotonicNow(t)
	denied := udp("10.244.0.5:40002", remotePod2)
	expectVerdict(t, "UDP to a pod not allowed", run(t, d.objs.TcEpIngress, denied.Bytes(), 0).Ret, tcActShot)
	expectVerdict(t, "again", run(t, d.objs.TcEpIngress, denied.Bytes(), 0).Ret, tcActShot)
	expectVerdicts(t, "UDP to a pod not allowed", r, t0, deny(Egress, ReasonNoMatch, denied), deny(Egress, ReasonNoMatch, denied))
}

// Traffic of directions that are not isolated is not reported, even where
// the endpoint has rules.
func TestVerdictsNotIsolated(t *testing.T) {
	d := setup(t, Options{})
	r := verdicts(t, d)
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{Ingress: []PolicyRule{{SetID: 99}}, EgressIsolated: true, Egress: []PolicyRule{{}}}))
	t0 := monotonicNow(t)
	expectVerdict(t, "new flow to the pod", toPod(t, d, tcp(outsider, pod, tcpSYN)), tcActOK)
	expectVerdict(t, "pod's reply", run(t, d.objs.TcEpIngress, tcp(pod, outsider, tcpSYN|tcpACK).Bytes(), 0).Ret, tcActOK)
	expectVerdicts(t, "a flow to the pod", r, t0)
	out := udp(clientPod, remotePod)
	expectVerdict(t, "new flow from the pod", run(t, d.objs.TcEpIngress, out.Bytes(), 0).Ret, tcActOK)
	expectVerdicts(t, "a flow from the pod", r, t0, allow(Egress, out))
}

// A full ring buffer counts what it cannot take: every verdict is either
// read or counted as lost. A second reader (another process, the next
// driver call) sees only what the first did not drain.
func TestVerdictsLost(t *testing.T) {
	d := setup(t, Options{})
	r := verdicts(t, d)
	must(t, d.SetEndpointPolicy(testIfindex, EndpointPolicy{IngressIsolated: true}))
	denied := tcp(outsider, pod, tcpSYN)
	expectVerdict(t, "SYN", toPod(t, d, denied), tcActShot)

	// A record takes its 8-byte header and the event, rounded up to 8.
	const fits = VerdictRingSize / (8 + verdictSize)
	const runs = fits + 1000
	ret, err := d.objs.TcEpEgress.Run(&ebpf.RunOptions{Data: denied.Bytes(), Repeat: runs - 1})
	must(t, err)
	expectVerdict(t, "repeated SYN", ret, tcActShot)

	lost, err := r.Lost()
	must(t, err)
	got, err := r.Drain()
	must(t, err)
	if len(got) != fits || uint64(len(got))+lost != runs {
		t.Errorf("%d verdicts read and %d lost, want %d read and %d lost", len(got), lost, fits, runs-fits)
	}
	for _, v := range got {
		v.TimeNs = 0
		if v != deny(Ingress, ReasonNoRules, denied) {
			t.Fatalf("verdict %s", v)
		}
	}

	// Another reader of the same pins: the ring buffer is drained, and its
	// position is shared.
	expectVerdict(t, "one more SYN", toPod(t, d, denied), tcActShot)
	r2 := verdicts(t, d) // drains the one verdict
	if r2.ID() != r.ID() {
		t.Errorf("second reader: ring buffer %d, want %d", r2.ID(), r.ID())
	}
	if got, err := r.Drain(); err != nil || len(got) != 0 {
		t.Errorf("first reader after the second drained: %v (%v)", got, err)
	}
	if lost2, err := r2.Lost(); err != nil || lost2 != lost {
		t.Errorf("second reader: lost %d (%v), want %d", lost2, err, lost)
	}
}

func TestOpenVerdictsNotPinned(t *testing.T) {
	requireBPF(t)
	if _, err := OpenVerdicts(bpffs(t)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenVerdicts of an empty pin directory: %v, want os.ErrNotExist", err)
	}
}
