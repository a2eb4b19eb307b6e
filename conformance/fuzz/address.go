package fuzz

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/topologies"
)

// Events of the address steps, as NODE-ADDRESS-CHANGE names them; their detail is
// the address.
const (
	EventAddressAdded   = "address-added"
	EventAddressRemoved = "address-removed"
)

// addressService is the Service a round with address steps probes on node 1's spare
// address, with a backend of its own on node 1 (NODE-ADDRESS-CHANGE says why not
// web-local: the client's source ports would meet that backend's TIME_WAIT).
const addressService = "web-added"

// addressProbe is the connect probe to addressService's NodePort on the spare
// address.
const addressProbe = "connect-nodeport-spare"

// address is the world of a round with address steps: node 1's spare address, the
// Service probed on it, and whether the address is on node 1's interface now.
type address struct {
	node  topologies.Node
	addr  netip.Addr
	svc   workloads.Service
	mu    sync.Mutex
	added bool
}

// deployAddress adds addressService and its backend on node, waits until its
// ClusterIP serves from client, and pins the external client's neighbour entry for
// the spare address to node, as a client that talked to it keeps it: every SYN to it
// reaches node, before the address is added and after it is removed, and only node
// decides whether it is answered.
func deployAddress(ctx context.Context, e *conformance.Env, node topologies.Node, client topologies.Pod) (*address, error) {
	a := &address{node: node, addr: node.SpareAddress()}
	if err := e.Topo.PinNeighbour(ctx, e.Topo.External(), a.addr, node); err != nil {
		return nil, fmt.Errorf("%w: %w", conformance.ErrEnvironment, err)
	}
	labels := map[string]string{"app": addressService}
	backend, _, err := workloads.AddBackend(ctx, e.World, addressService, node.Name(), labels)
	if err != nil {
		return nil, err
	}
	if a.svc, err = workloads.AddService(ctx, e.World, addressService, labels, backend); err != nil {
		return nil, err
	}
	fl := workloads.Flow{Name: "clusterip-added", From: client, Target: a.svc.ClusterIPAddr(), Backend: addressService}
	return a, workloads.WaitFlowing(ctx, e.World, fl, e.Warm())
}

// traffic is a new connection every interval from the external client to the
// Service's NodePort on the spare address.
func (a *address) traffic(e *conformance.Env, interval time.Duration) conformance.Traffic {
	return conformance.Traffic{From: e.Topo.External(),
		Probe: probe.Connect{Name: addressProbe, Target: a.svc.NodePortAt(a.addr), Interval: interval, Timeout: e.Budgets.AttemptTimeout}}
}

// set adds the spare address to node 1's interface or removes it, recording the
// change once it is made; a step that asks for what is already so does nothing (a
// shrunk schedule may have lost the step before it).
func (a *address) set(ctx context.Context, e *conformance.Env, add bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.added == add {
		return nil
	}
	if add {
		if err := a.node.AddAddress(ctx, a.addr); err != nil {
			return err
		}
		e.Record(EventAddressAdded, a.addr.String())
	} else {
		if err := a.node.RemoveAddress(ctx, a.addr); err != nil {
			return err
		}
		e.Record(EventAddressRemoved, a.addr.String())
	}
	a.added = add
	return nil
}

// addressModel says when the spare address must be served and when it must not, from
// the timeline's address events: an address added is served from address-programmed
// after, one removed (or never added) answers nothing from address-programmed after.
// A change made while node 1's agent is down, or in the budget before it goes down,
// is due address-programmed after it is ready again: the agent may learn of it only
// then (its datapath keeps what it had before, as the Services' model allows).
type addressModel struct {
	tl      func() []timeline.Transition
	budget  time.Duration
	timeout time.Duration // an attempt's: one that a change meets is not judged
	node    string

	once    sync.Once
	changes []addressChange
	downs   []span
}

type addressChange struct {
	at    monotime.Time
	added bool
}

func (m *addressModel) build() {
	trs := m.tl()
	m.downs = downs(trs, m.node)
	for _, tr := range trs {
		switch tr.Name {
		case EventAddressAdded, EventAddressRemoved:
			m.changes = append(m.changes, addressChange{tr.Time, tr.Name == EventAddressAdded})
		}
	}
}

// due is when a change made at t must be in the datapath: budget after it, or after
// the agent is ready again if it was down at some moment before that (0: never, the
// agent was not ready again).
func (m *addressModel) due(t monotime.Time) monotime.Time {
	d := t.Add(m.budget)
	for _, s := range m.downs {
		if s.from < d && (s.to == 0 || s.to > t) {
			if s.to == 0 {
				return 0
			}
			d = max(d, s.to.Add(m.budget))
		}
	}
	return d
}

// verdict is what the model says of an attempt started at t: served (true, judged),
// not served (false, judged), or not judged (a change is due or meets it).
func (m *addressModel) verdict(t monotime.Time) (served, judged bool, why string) {
	m.once.Do(m.build)
	added, since := false, monotime.Time(0) // the state at t, and the change that made it
	for _, c := range m.changes {
		if c.at > t.Add(m.timeout) {
			break
		}
		if c.at > t {
			return false, false, "" // the address changes while the attempt is open
		}
		added, since = c.added, c.at
	}
	if since == 0 {
		return false, true, "never added"
	}
	if d := m.due(since); d == 0 || t < d {
		return false, false, ""
	}
	if added {
		return true, true, fmt.Sprintf("added %s before", time.Duration(t-since).Round(time.Millisecond))
	}
	return false, true, fmt.Sprintf("removed %s before", time.Duration(t-since).Round(time.Millisecond))
}

// addressAsModelled is the round's check that the NodePort on the spare address
// answered as the model says: every new connection answered by its backend while the
// address is due to be served, none answered while it is due not to be. A
// violation is of the failed attempt's kind, or of kind delivered.
type addressAsModelled struct {
	m *addressModel
	modelReport
}

func newAddressAsModelled(m *addressModel) *addressAsModelled {
	return &addressAsModelled{m: m, modelReport: modelReport{
		expected: "the spare address's NodePort served while it is on the node, and only then", negated: "the spare address's NodePort not as modelled"}}
}

// WithDefaults keeps the matcher as it is: its options are its own.
func (c *addressAsModelled) WithDefaults(...matchers.Option) matchers.Matcher { return c }

func (c *addressAsModelled) Match(actual any) (bool, error) {
	w, err := c.window(actual)
	if err != nil {
		return false, err
	}
	var wrong []wrongAttempt
	judged, seen := 0, 0
	for _, e := range w.Inside() {
		if e.Kind != probe.KindAttempt || e.Probe != addressProbe {
			continue
		}
		seen++
		served, ok, why := c.m.verdict(e.Time)
		if !ok {
			continue
		}
		answered := e.Outcome == probe.OK
		switch {
		case served && !answered:
			if k := matchers.AttemptKind(e, []string{addressService}); k != "" {
				wrong = append(wrong, wrongAttempt{e, k, "was due to be served (" + why + ") but not answered"})
			}
		case served && e.Backend != addressService:
			wrong = append(wrong, wrongAttempt{e, matchers.KindWrongBackend, "was answered by " + e.Backend})
		case !served && answered:
			wrong = append(wrong, wrongAttempt{e, matchers.KindDelivered, "was due not to be served (" + why + ") but answered by " + e.Backend})
		}
		judged++
	}
	passed := c.judge(w, "unmodelled_address_outcomes", "judged attempts on the spare address not as its changes say", judged, wrong)
	if seen == 0 {
		c.blind("probe " + addressProbe + " made no attempt in the window")
		return false, fmt.Errorf("%w: %s: the round cannot judge the spare address", matchers.ErrInstrument, c.res.First)
	}
	return passed, nil
}
