package fuzz

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// A UDP flow is one socket of the client, so one 5-tuple, sending to a Service's
// UDP twin for the rest of the round: a datapath that remembers the flow's backend
// sends it there for as long as its conntrack entry lives, so once that backend
// has left the Service the entry must go (SVC-UDP-ENDPOINT-CHANGE's rule, judged
// here by who answers: the spares keep serving after they leave).
const (
	// udpFlowsPerJoin is how many flows the client opens on the twin of the Service
	// a ready spare joins: each lands on one of the Service's backends, so some
	// land on the spare while it is in.
	udpFlowsPerJoin = 4
	// udpFlowSpacing is the time between those flows' first datagrams: the first
	// may well meet a datapath that has not programmed the spare yet, the later
	// ones seldom.
	udpFlowSpacing = 250 * time.Millisecond
	// udpFlowInterval is how often each flow sends a datagram.
	udpFlowInterval = 20 * time.Millisecond
)

// udpTwin is the name of the UDP Service that selects the pods Service svc selects.
func udpTwin(svc string) string { return svc + "-udp" }

// udpFlows are the UDP twins of a round's Services and the flows on them.
type udpFlows struct {
	client topologies.Pod
	twins  map[string]workloads.Service // Service -> its UDP twin

	mu sync.Mutex
	of map[string]string // flow probe -> the Service whose twin it sends to
}

// deployUDP adds a UDP twin of each of core's Services, selecting what it selects,
// and waits until each answers from the client by the Service's own backend.
func deployUDP(ctx context.Context, e *conformance.Env, core *workloads.Core) (*udpFlows, error) {
	u := &udpFlows{client: core.Client, twins: map[string]workloads.Service{}, of: map[string]string{}}
	for _, svc := range []workloads.Service{core.SvcLocal, core.SvcRemote} {
		twin, err := workloads.AddUDPService(ctx, e.World, udpTwin(svc.Name), map[string]string{"app": svc.Name}, svc.Backends...)
		if err != nil {
			return nil, err
		}
		fl := workloads.Flow{Name: twin.Name, From: core.Client, Target: twin.ClusterIPAddr(), Backend: svc.Backends[0].Name()}
		if err := workloads.WaitUDPFlowing(ctx, e.World, fl, e.Warm()); err != nil {
			return nil, err
		}
		u.twins[svc.Name] = twin
	}
	return u, nil
}

// flow is the probe of flow name on svc's twin.
func (u *udpFlows) flow(e *conformance.Env, name, svc string) probe.UDP {
	return probe.UDP{Name: name, To: []probe.Destination{{Label: udpTwin(svc), Addr: u.twins[svc].ClusterIPAddr()}},
		Interval: udpFlowInterval, Replies: true, Timeout: e.Budgets.AttemptTimeout}
}

// startFlow is the name of the flow on svc's twin that runs from before the
// schedule.
func startFlow(svc string) string { return "udp-" + svc }

// traffic is a flow on each twin from before the schedule, and the precondition
// that each is answered then.
func (u *udpFlows) traffic(e *conformance.Env) ([]conformance.Traffic, []conformance.Check) {
	var tr []conformance.Traffic
	var names []string
	for _, svc := range Services {
		name := startFlow(svc)
		u.register(name, svc)
		tr = append(tr, conformance.Traffic{From: u.client, Probe: u.flow(e, name, svc)})
		names = append(names, name)
	}
	return tr, []conformance.Check{{Name: "the UDP flows are answered before the schedule",
		Matcher: matchers.HaveDatagramsAnswered(matchers.Probes(names...))}}
}

// open starts the flows of step (a join of a ready spare to svc), udpFlowSpacing
// apart; it stops early, with no error, when ctx ends.
func (u *udpFlows) open(ctx context.Context, e *conformance.Env, step int, svc string) error {
	for k := range udpFlowsPerJoin {
		if k > 0 && conformance.Hold(ctx, udpFlowSpacing) != nil {
			return nil
		}
		name := fmt.Sprintf("udp-%d-%d", step, k+1)
		u.register(name, svc)
		if _, err := e.World.StartProbe(ctx, u.client, u.flow(e, name, svc)); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("probe %s: %w", name, err)
		}
	}
	return nil
}

// register records that flow sends to svc's twin, before its first datagram.
func (u *udpFlows) register(flow, svc string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.of[flow] = svc
}

// service is the Service whose twin flow sends to.
func (u *udpFlows) service(flow string) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	svc, ok := u.of[flow]
	return svc, ok
}

// flowGaps is the round's check that no UDP flow goes unanswered for longer than
// limit, measured as a stream's gap is: from a datagram that was answered to the
// next one that was (or to the flow's last datagram in the window, if none after
// it was). Every backend a flow may reach serves throughout, and a datapath that
// moves a flow picks a backend for its next datagram, so its loss is the
// datapath's. A violation is of kind gap; its datagrams are those of the run.
type flowGaps struct {
	flow  func(probe string) (string, bool)
	limit time.Duration
	name  string // the limit's budget
	modelReport
}

func newFlowGaps(flow func(string) (string, bool), limit time.Duration, name string) *flowGaps {
	return &flowGaps{flow: flow, limit: limit, name: name, modelReport: modelReport{
		expected: "every UDP flow answered within " + name, negated: "a UDP flow unanswered for longer than " + name}}
}

// WithDefaults keeps the matcher as it is, as answersAsModelled does.
func (m *flowGaps) WithDefaults(...matchers.Option) matchers.Matcher { return m }

func (m *flowGaps) Match(actual any) (bool, error) {
	w, err := m.window(actual)
	if err != nil {
		return false, err
	}
	sent := map[string][]probe.Event{} // flow -> its datagrams, in the order sent
	answered := map[string]map[uint64]bool{}
	for _, e := range w.Inside() {
		if _, ok := m.flow(e.Probe); !ok {
			continue
		}
		switch e.Kind {
		case probe.KindSent:
			sent[e.Probe] = append(sent[e.Probe], e)
		case probe.KindReply:
			if answered[e.Probe] == nil {
				answered[e.Probe] = map[uint64]bool{}
			}
			answered[e.Probe][e.Seq] = true
		}
	}
	var wrong []wrongAttempt
	judged := 0
	for _, flow := range slices.Sorted(maps.Keys(sent)) {
		ds := sent[flow]
		judged += len(ds)
		last := -1 // the last answered datagram
		for i := 0; i <= len(ds); i++ {
			if i < len(ds) && !answered[flow][ds[i].Seq] {
				continue
			}
			// ds[last+1:i] went unanswered, from ds[last] (or the flow's first
			// datagram in the window) to ds[i] (or its last).
			if i-last > 1 {
				from, to := ds[0].Time, ds[len(ds)-1].Time
				if last >= 0 {
					from = ds[last].Time
				}
				if i < len(ds) {
					to = ds[i].Time
				}
				if gap := to.Sub(from); gap > m.limit {
					why := fmt.Sprintf("unanswered, one of %d in a row: the flow had no answer for %s (budget %s)", i-last-1, gap.Round(time.Millisecond), m.limit)
					for _, d := range ds[last+1 : i] {
						wrong = append(wrong, wrongAttempt{d, matchers.KindGap, why})
					}
				}
			}
			last = i
		}
	}
	slices.SortStableFunc(wrong, func(a, b wrongAttempt) int { return cmp.Compare(a.e.Time, b.e.Time) })
	return m.judge(w, "unanswered_flow_datagrams", "UDP flows' datagrams in a run unanswered for longer than "+m.name, judged, wrong), nil
}
