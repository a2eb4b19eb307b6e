// Package fuzz composes the suite's transitions at random: a seeded generator draws a
// schedule of steps (agent restarts, crashes, outages and upgrades on either node, a
// switch from kube-proxy, backends labelled into and out of the Services, the truth
// table's NetworkPolicies put in force, pods that appear under them, a node's
// address added and removed) with random timing, overlaps included; a round runs one
// schedule in a fresh world under continuous traffic, and its checks judge the whole
// of it against a model of the API's state, not against a script.
// A failing schedule is shrunk (delta debugging over its steps, each candidate
// replayed in a fresh world) to a minimal one, written as a replay file.
package fuzz

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Op is what a step of a schedule does.
type Op string

// The steps a schedule is made of: the suite's own, as the specs use them.
const (
	// OpRestart restarts the agent on Node gracefully (conformance.Restart).
	OpRestart Op = "restart"
	// OpCrash kills the agent on Node and starts it (conformance.Crash).
	OpCrash Op = "crash"
	// OpUpgrade moves the agent on Node to the other version: to the newest the
	// implementation offers from the one it started with, or back
	// (conformance.UpgradeAgent, conformance.RollBackAgent).
	OpUpgrade Op = "upgrade"
	// OpOutage stops the agent on Node gracefully, keeps it down For, and starts it
	// (conformance.Stop, conformance.Start): what changes meanwhile it must catch up
	// on when it is ready again.
	OpOutage Op = "outage"
	// OpJoin labels the spare backend Backend into Service (out of any other).
	OpJoin Op = "join"
	// OpLeave labels the spare backend Backend out of every Service.
	OpLeave Op = "leave"
	// OpVanish removes the spare backend Backend, in no Service by then, as a lost
	// sandbox goes (conformance.VanishPod): its network first, so that nothing
	// closes the connections that reached it through a Service while it was in
	// one; the datapath must end them (SVC-ENDPOINT-VANISH's rule).
	OpVanish Op = "vanish"
	// OpSwitch hands Node over from the real kube-proxy to the implementation
	// (conformance.Switch): a round with one starts with kube-proxy on that node,
	// and it is the first step there.
	OpSwitch Op = "switch"
	// OpPolicy puts the NetworkPolicies of POLICY-TRUTH-TABLE's case Case in force
	// in the netpol fixture (a round with one deploys it): the others deleted, those
	// of the same name updated in place.
	OpPolicy Op = "policy"
	// OpPod adds a pod to the netpol fixture (x/new-N, N the step's number, on
	// node 1, labelled as Like is), its connections open from its first packet.
	OpPod Op = "pod"
	// OpAddAddress adds node 1's spare address to its interface, where a NodePort
	// must then answer (NODE-ADDRESS-CHANGE's transition, in two steps).
	OpAddAddress Op = "add-address"
	// OpRemoveAddress removes it again: nothing may answer there then.
	OpRemoveAddress Op = "remove-address"
	// OpChurn puts node 1's SNAT ports under pressure For: the external client
	// opens churnProbes new connections every connect-interval (the catalogue's,
	// 2 ms) through node 1's NodePort to the Service whose own backend is on node
	// 2, a path the datapath SNATs, while the round's streams hold that path
	// (SVC-SNAT-PRESSURE's churn): once the range is full, every new flow reuses a
	// port, and none may take a live stream's.
	OpChurn Op = "churn"
)

// Offset is a time from a schedule's start, written as a duration ("1.25s").
type Offset time.Duration

// MarshalJSON writes o as a duration string.
func (o Offset) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(o).String()) }

// UnmarshalJSON reads a duration string.
func (o *Offset) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("an offset is a duration such as \"1.25s\": %w", err)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*o = Offset(d)
	return nil
}

// Action is one step of a schedule, due At after the schedule's start. Steps on one
// node's agent, or on one backend, run in order, each once the one before it ended
// (a restart waits for readiness): a step due while its node is busy starts late,
// and the timeline has when it really ran.
type Action struct {
	At Offset `json:"at"`
	Op Op     `json:"op"`
	// Node is the agent's node (OpRestart, OpCrash, OpUpgrade, OpOutage, OpSwitch), counted
	// from 1 in the topology's order.
	Node    int    `json:"node,omitempty"`
	For     Offset `json:"for,omitempty"`     // OpOutage: how long the agent stays down; OpChurn: how long it churns
	Backend string `json:"backend,omitempty"` // OpJoin, OpLeave, OpVanish: a spare backend
	Service string `json:"service,omitempty"` // OpJoin
	Case    string `json:"case,omitempty"`    // OpPolicy
	// Like is the pod of namespace x whose label the new pod has (OpPod): "a"
	// or "b" (pod=a or pod=b), b where empty.
	Like string `json:"like,omitempty"`
}

// PodLikes are the pods of namespace x a new pod may be labelled as: x/a, which
// most of the truth table's cases select (so a pod like it appears isolated, its
// first packets denied or admitted as the policy in force says), and x/b, which
// some admit as a peer.
var PodLikes = []string{"a", "b"}

// like is the label a new pod of a has.
func (a Action) like() string { return cmp.Or(a.Like, "b") }

// String is the action for people, e.g. "+1.250s crash node 1".
func (a Action) String() string {
	at := fmt.Sprintf("+%.3fs", time.Duration(a.At).Seconds())
	switch a.Op {
	case OpJoin:
		return fmt.Sprintf("%s join %s to %s", at, a.Backend, a.Service)
	case OpLeave:
		return fmt.Sprintf("%s leave %s", at, a.Backend)
	case OpVanish:
		return fmt.Sprintf("%s %s vanishes", at, a.Backend)
	case OpOutage:
		return fmt.Sprintf("%s outage node %d for %s", at, a.Node, time.Duration(a.For))
	case OpSwitch:
		return fmt.Sprintf("%s switch node %d from kube-proxy", at, a.Node)
	case OpPolicy:
		return fmt.Sprintf("%s policies: %s", at, a.Case)
	case OpPod:
		return fmt.Sprintf("%s a pod like x/%s appears", at, a.like())
	case OpAddAddress:
		return fmt.Sprintf("%s add node 1's spare address", at)
	case OpRemoveAddress:
		return fmt.Sprintf("%s remove node 1's spare address", at)
	case OpChurn:
		return fmt.Sprintf("%s churn node 1's SNAT ports for %s", at, time.Duration(a.For))
	}
	return fmt.Sprintf("%s %s node %d", at, a.Op, a.Node)
}

// resource is what an action works on; actions on one run in order.
func (a Action) resource() string {
	if a.Op == OpJoin || a.Op == OpLeave || a.Op == OpVanish {
		return "backend " + a.Backend
	}
	if a.Op == OpPolicy || a.Op == OpPod {
		return "policies"
	}
	if a.HasAddress() {
		return "address"
	}
	if a.Op == OpChurn {
		return "churn"
	}
	return fmt.Sprintf("node %d", a.Node)
}

// Schedule is one round's steps, in the order they are due, and the rate of the
// round's new connections.
type Schedule struct {
	Seed  uint64 `json:"seed"`
	Round int    `json:"round"`
	// ConnectInterval is the time between new connections on each path (0:
	// DefaultConnectInterval).
	ConnectInterval Offset `json:"connectInterval,omitempty"`
	// Mode is the implementation's mode its agents start in (start --mode; empty:
	// its default).
	Mode    string   `json:"mode,omitempty"`
	Actions []Action `json:"actions"`
}

// DefaultConnectInterval is the time between a round's new connections on each of
// its four paths: 50 a second each. A round holds its traffic for tens of seconds,
// and a dataplane's tuple space is finite: at the catalogue's connect-interval (2 ms)
// the NodePort path to the remote backend, SNATed, takes 500 SNAT ports a second,
// and the reference's 4,536 came round again within the backend's TIME_WAIT (60 s),
// whose PAWS check then rejected the new SYNs (3,348 in one run of 34 s, each a SYN
// retransmitted); across such runs about one new connection in 20,000, on any path,
// timed out. Linux's NAT would run out nearly as fast. That is load, not
// transitions: the specs hold 2 ms for seconds, the fuzzer 20 ms for as long as it
// runs.
const DefaultConnectInterval = 20 * time.Millisecond

func (s Schedule) interval() time.Duration {
	if s.ConnectInterval > 0 {
		return time.Duration(s.ConnectInterval)
	}
	return DefaultConnectInterval
}

// String lists the schedule's steps, one per line.
func (s Schedule) String() string {
	lines := make([]string, len(s.Actions))
	for i, a := range s.Actions {
		lines[i] = fmt.Sprintf("%2d. %s", i+1, a)
	}
	return strings.Join(lines, "\n")
}

// HasPolicies reports whether the schedule puts NetworkPolicies in force.
func (s Schedule) HasPolicies() bool {
	return slices.ContainsFunc(s.Actions, func(a Action) bool { return a.Op == OpPolicy || a.Op == OpPod })
}

// HasAddress reports whether a changes node 1's spare address.
func (a Action) HasAddress() bool { return a.Op == OpAddAddress || a.Op == OpRemoveAddress }

// HasAddress reports whether the schedule changes node 1's spare address.
func (s Schedule) HasAddress() bool { return slices.ContainsFunc(s.Actions, Action.HasAddress) }

// Vanished are the spares that vanish in s.
func (s Schedule) Vanished() []string {
	var out []string
	for _, a := range s.Actions {
		if a.Op == OpVanish {
			out = append(out, a.Backend)
		}
	}
	return out
}

// churns are the indexes of s's churns.
func (s Schedule) churns() []int {
	var out []int
	for i, a := range s.Actions {
		if a.Op == OpChurn {
			out = append(out, i)
		}
	}
	return out
}

// joinStreams are the names of the streams s's joins of a ready spare open.
func (s Schedule) joinStreams() []string {
	var out []string
	for i, a := range s.Actions {
		if a.Op == OpJoin && a.Backend != unready {
			out = append(out, joinStream(i+1))
		}
	}
	return out
}

// Switched is the node (counted from 1) the schedule switches from kube-proxy, or 0.
func (s Schedule) Switched() int {
	for _, a := range s.Actions {
		if a.Op == OpSwitch {
			return a.Node
		}
	}
	return 0
}

// Span is when the last step is due.
func (s Schedule) Span() time.Duration {
	if len(s.Actions) == 0 {
		return 0
	}
	return time.Duration(s.Actions[len(s.Actions)-1].At)
}

// vanishAfterLeave is the least time from a spare's leave to its vanishing: past
// udp-repoint (2 s by default), the time the datapath has to move the UDP flows
// off the spare, so that a flow left on it when it goes is the datapath's fault and
// the ones moved in time lose nothing. Shrinking keeps it too.
const vanishAfterLeave = 2500 * time.Millisecond

// podLikeStream, vanishStream and churnStream set the random streams of new pods'
// labels, of spares' vanishing and of churns apart from a round's own.
const (
	podLikeStream = 1 << 63
	vanishStream  = 1 << 62
	churnStream   = 1 << 61
)

// A churn lasts churnFor to churnFor+churnJitter: the reference's 4,536 SNAT ports
// are all taken some 5 s into SVC-SNAT-PRESSURE's churn, and from then on a port
// allocator that takes a live flow's port does so about once in 2,300 new flows
// for each live flow on the path (a churning round holds churnStreams there: once
// in some 290), at 1,000 flows a second.
const (
	churnFor    = 10 * time.Second
	churnJitter = 4 * time.Second
)

// Claims are what a schedule may draw on: the implementation's nodes, spare
// backends and Services, whether it offers versions to upgrade between and takes a
// node over from kube-proxy, the policy cases it may put in force (none where
// NetworkPolicy is not claimed), and whether node 1 has a spare address to add.
type Claims struct {
	Nodes    int
	Spares   []string
	Services []string
	Upgrade  bool
	Switch   bool
	Policies []string
	Address  bool
	// Churn: node 1's NodePort to node 2's backend, a SNATed path, may be churned.
	Churn bool
}

// Generate draws round's schedule of n steps from seed: the same seed, round and
// claims always give the same schedule. The steps' gaps are exponential with a mean
// of span/n, so some steps fall inside another's window (a crash during a restart
// of the other node, a backend leaving while the agent is down) and others are far
// apart; an outage of node 1 has a Service change (or a new pod) inside it, an
// address added is removed seconds later, and so, in half the draws, is a spare that
// joins. Where the implementation takes nodes over from kube-proxy, about one round
// in four starts with node 1 (whose agent programs every path) under kube-proxy and
// switches it at once, so the round's first steps fall inside the hand-over. (Not
// more: a stream opened through kube-proxy stays in Linux conntrack, so in such a
// round no stream tests the implementation's own conntrack across a restart.) About
// one round in four churns node 1's SNAT ports (OpChurn) for 10 to 14 s from a time
// in the span: such a round runs that much longer, and so it is drawn apart from
// the other steps, which stay as they were drawn before there were churns.
func Generate(seed uint64, round int, c Claims, n int, span time.Duration) Schedule {
	rng := rand.New(rand.NewPCG(seed, uint64(round)))
	// A new pod's label is drawn from a stream of its own, so that a seed's steps
	// and times are what they were before pods had one.
	likes := rand.New(rand.NewPCG(seed, uint64(round)^podLikeStream))
	s := Schedule{Seed: seed, Round: round}
	member := map[string]string{} // spare -> the Service it is labelled into
	ops := []Op{OpRestart, OpRestart, OpCrash, OpCrash, OpOutage, OpOutage, OpJoin, OpJoin, OpJoin}
	if c.Upgrade {
		ops = append(ops, OpUpgrade, OpUpgrade)
	}
	if len(c.Policies) > 0 {
		// The truth table has many cases, and a fault of the policies shows under
		// few of them: a round draws policies often.
		ops = append(ops, OpPolicy, OpPolicy, OpPolicy, OpPod)
	}
	if c.Address {
		ops = append(ops, OpAddAddress)
	}
	if len(c.Spares) == 0 || len(c.Services) == 0 {
		ops = slices.DeleteFunc(ops, func(o Op) bool { return o == OpJoin })
	}
	mean := float64(span) / float64(max(n, 1))
	at := time.Duration(0)
	if c.Switch && n > 0 && rng.IntN(4) == 0 {
		s.Actions = append(s.Actions, Action{Op: OpSwitch, Node: 1})
	}
	membership := func(a *Action) {
		// A spare's membership changes: out of its Service, or into one (moved
		// from another now and then).
		a.Backend = c.Spares[rng.IntN(len(c.Spares))]
		if cur := member[a.Backend]; cur != "" && rng.IntN(4) != 0 {
			a.Op = OpLeave
			delete(member, a.Backend)
			return
		}
		a.Op, a.Service = OpJoin, c.Services[rng.IntN(len(c.Services))]
		member[a.Backend] = a.Service
	}
	removed := Offset(0) // when the address added last is removed
	for len(s.Actions) < n {
		at += time.Duration(rng.ExpFloat64() * mean).Round(time.Millisecond)
		a := Action{At: Offset(at), Op: ops[rng.IntN(len(ops))]}
		for a.Op == OpAddAddress && a.At < removed {
			a.Op = ops[rng.IntN(len(ops))] // it is there: something else
		}
		var then *Action // a step this one brings, due later
		switch a.Op {
		case OpRestart, OpCrash, OpUpgrade:
			a.Node = 1 + rng.IntN(c.Nodes)
		case OpOutage:
			a.Node = 1 + rng.IntN(c.Nodes)
			a.For = Offset(time.Duration(300+rng.IntN(2700)) * time.Millisecond)
			// While node 1's agent, which programs every path, is down, a Service
			// changes: it must have caught up when it is ready again. A member
			// leaves if there is one (a backend gone is what a stale datapath
			// shows), else a spare joins. Where policies are claimed, in half the
			// draws a pod appears instead: it must be policed from the agent's
			// start, though no program of the agent's saw it created.
			joins := slices.Contains(ops, OpJoin)
			if a.Node == 1 && (joins || len(c.Policies) > 0) && len(s.Actions)+2 <= n {
				then = &Action{At: a.At + a.For/2}
				if len(c.Policies) > 0 && (!joins || rng.IntN(2) == 0) {
					then.Op = OpPod
				} else if members := slices.Sorted(maps.Keys(member)); len(members) > 0 {
					then.Op, then.Backend = OpLeave, members[rng.IntN(len(members))]
					delete(member, then.Backend)
				} else {
					membership(then)
				}
			}
		case OpJoin:
			membership(&a)
			// A spare that joins leaves again, 2.5 to 6 s later, in half the
			// draws: what was opened to it while it was in (a UDP flow) must
			// move off it once it is out. Drawn otherwise, a spare leaves seldom
			// (only when the spare drawn is in a Service).
			if a.Op == OpJoin && len(s.Actions)+2 <= n && rng.IntN(2) == 0 {
				then = &Action{At: a.At + Offset(time.Duration(2500+rng.IntN(3500))*time.Millisecond), Op: OpLeave, Backend: a.Backend}
				delete(member, a.Backend)
			}
		case OpPolicy:
			a.Case = c.Policies[rng.IntN(len(c.Policies))]
		case OpAddAddress:
			// Added, and removed 1.5 to 5 s later, after it had its time to be
			// served (address-programmed, 1 s): both changes are judged.
			removed = Offset(1 << 62) // until the end, unless it is removed
			if len(s.Actions)+2 <= n {
				then = &Action{At: a.At + Offset(time.Duration(1500+rng.IntN(3500))*time.Millisecond), Op: OpRemoveAddress}
				removed = then.At
			}
		}
		s.Actions = append(s.Actions, a)
		if then != nil {
			s.Actions = append(s.Actions, *then)
		}
	}
	slices.SortStableFunc(s.Actions, byAt)
	if len(c.Services) == 0 && len(c.Policies) > 0 && !slices.ContainsFunc(s.Actions, func(a Action) bool { return a.Op == OpPolicy }) && len(s.Actions) > 0 {
		// Where policies are all a world has, a round that put none in force would
		// judge only that everything reaches everything, which a datapath that
		// does nothing passes: its first step puts one in force instead.
		first := &s.Actions[0]
		*first = Action{At: first.At, Op: OpPolicy, Case: c.Policies[rng.IntN(len(c.Policies))]}
	}
	for i := range s.Actions {
		if s.Actions[i].Op == OpPod {
			s.Actions[i].Like = PodLikes[likes.IntN(len(PodLikes))]
		}
	}
	// A step drawn after an outage's inner one may fall due before it: in the order
	// they are due, a spare leaves only a Service it is in. (An address is added only
	// once the one before is removed, so those are in order as drawn.) Before the
	// vanish is drawn: a leave made a join here would otherwise bring back into its
	// Service the spare that vanishes.
	clear(member)
	for i := range s.Actions {
		switch a := &s.Actions[i]; a.Op {
		case OpJoin:
			member[a.Backend] = a.Service
		case OpLeave:
			if member[a.Backend] == "" {
				a.Op, a.Service = OpJoin, c.Services[rng.IntN(len(c.Services))]
				member[a.Backend] = a.Service
				continue
			}
			delete(member, a.Backend)
		}
	}
	s.Actions = vanishes(rand.New(rand.NewPCG(seed, uint64(round)^vanishStream)), s.Actions)
	if c.Churn {
		s.Actions = churn(rand.New(rand.NewPCG(seed, uint64(round)^churnStream)), s.Actions, span)
	}
	return s
}

// leftService is the Service the spare of step i (a leave) leaves: the one its last
// join before it, with no leave between, put it in; empty if none did (a shrunk
// schedule may hold a leave of a spare in no Service).
func (s Schedule) leftService(i int) string {
	svc := ""
	for _, a := range s.Actions[:i] {
		switch {
		case a.Backend != s.Actions[i].Backend:
		case a.Op == OpJoin:
			svc = a.Service
		case a.Op == OpLeave:
			svc = ""
		}
	}
	return svc
}

// churn adds to actions, in one draw of four, a churn due at a time in span.
func churn(rng *rand.Rand, actions []Action, span time.Duration) []Action {
	if rng.IntN(4) != 0 {
		return actions
	}
	c := Action{At: Offset(time.Duration(rng.Int64N(int64(span))).Round(time.Millisecond)), Op: OpChurn,
		For: Offset(churnFor + time.Duration(rng.Int64N(int64(churnJitter))).Round(time.Millisecond))}
	return withAction(actions, c)
}

// vanishes adds to actions, in half the draws, the vanishing of a ready spare that
// left a Service and joins none again: 2.5 to 4 s after its leave, past the time a
// UDP flow has to move off it (udp-repoint), so that what it still holds is the TCP
// connections it was given while it was in; not after a leave during a step of
// node 1's agent. One spare vanishes at most (the spare
// that leaves last), so a round keeps a spare to join. It draws from a stream of its
// own: the steps before are as they were, and a round with a vanish has one step
// more than it was drawn with.
func vanishes(rng *rand.Rand, actions []Action) []Action {
	last := -1 // the last leave of a ready spare that no join follows
	for i, a := range actions {
		switch {
		case a.Op == OpLeave && a.Backend != unready:
			last = i
		case a.Op == OpJoin && last >= 0 && actions[last].Backend == a.Backend:
			last = -1
		}
	}
	if last < 0 || rng.IntN(2) != 0 {
		return actions
	}
	leave := actions[last]
	for _, a := range actions {
		// A leave while node 1's agent, which moves the client's UDP flows, is down
		// (or within a second of its start) is programmed only once it is ready:
		// its flows may still be on the spare 2.5 s after it, and a vanishing
		// would cut them off through no fault of the datapath.
		if a.Node == 1 && a.Op != OpSwitch && leave.At >= a.At && leave.At <= a.At+a.For+Offset(time.Second) {
			return actions
		}
	}
	v := Action{At: leave.At + Offset(vanishAfterLeave+time.Duration(rng.IntN(1500))*time.Millisecond), Op: OpVanish, Backend: leave.Backend}
	return withAction(actions, v)
}

// byAt orders actions by when they fall due; sorted stably, steps due at once stay
// in the order they were drawn.
func byAt(a, b Action) int { return cmp.Compare(a.At, b.At) }

// withAction is a copy of actions with a added, in the order they fall due (a after
// the steps due at once with it).
func withAction(actions []Action, a Action) []Action {
	out := append(slices.Clone(actions), a)
	slices.SortStableFunc(out, byAt)
	return out
}
