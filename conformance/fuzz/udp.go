package fuzz

import (
	"context"
	"fmt"
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
	u.mu.Lock()
	u.of[name] = svc
	u.mu.Unlock()
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
		if _, err := e.World.StartProbe(ctx, u.client, u.flow(e, name, svc)); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("probe %s: %w", name, err)
		}
	}
	return nil
}

// service is the Service whose twin flow sends to.
func (u *udpFlows) service(flow string) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	svc, ok := u.of[flow]
	return svc, ok
}
