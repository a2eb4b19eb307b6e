package conformance

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/probe"
)

// Budgets are every limit and rate the suite holds an implementation to, in one place
// (the Gateway API TimeoutConfig model). Each says what a conformant implementation may
// need; a run may override any of them (`dpconform run --budget name=value`), and the
// report records the budgets it ran with next to every measured figure.
type Budgets struct {
	// Lead is how long before the first transition event a spec's window starts: the
	// steady traffic just before a transition is part of what is judged.
	Lead time.Duration `budget:"lead"`
	// Settle is how long after the last transition event (ready, for a restart) a
	// window ends: an implementation that is ready must also carry traffic.
	Settle time.Duration `budget:"settle"`
	// SteadyState is how long traffic runs before a transition to prove the
	// preconditions.
	SteadyState time.Duration `budget:"steady-state"`
	// ConnectInterval is the period of new connections (a finer probe catches shorter
	// windows; 2 ms catches Calico 12192's 80 ms window every time).
	ConnectInterval time.Duration `budget:"connect-interval" probe:"schedule"`
	// AttemptTimeout is how long a connection attempt may take before it fails: more
	// than a SYN retransmit would be a stall no client tolerates.
	AttemptTimeout time.Duration `budget:"attempt-timeout"`
	// MaxBlind is the longest a connect probe may go without starting an attempt
	// before it is called blind (an environment error, not a verdict).
	MaxBlind time.Duration `budget:"max-blind"`
	// StreamInterval is the period of messages on a long-lived stream.
	StreamInterval time.Duration `budget:"stream-interval" probe:"schedule"`
	// StreamMaxGap is the longest a stream may go without an echo across a transition.
	StreamMaxGap time.Duration `budget:"stream-max-gap"`
	// AliveWithin is how recent a stream's last echo must be at a window's end for it
	// to count as alive.
	AliveWithin time.Duration `budget:"alive-within"`
	// EndWithin is how soon a stream to a removed backend must end (RST or FIN)
	// instead of hanging.
	EndWithin time.Duration `budget:"end-within"`
	// ReconcileWithin is how soon after an agent that was down reports ready again
	// every new connection to a Service whose backends changed meanwhile must succeed
	// (RESTART-RECONCILE): from ready itself none may reach a backend the Service no
	// longer has, and a new Service must answer; a Service switched to its new
	// backends delete-then-add may fail a few connections until then.
	ReconcileWithin time.Duration `budget:"reconcile-within"`
	// UDPRepoint is how soon after the EndpointSlices stop listing a UDP flow's
	// backend the flow (one 5-tuple) must reach a backend that is listed: the
	// dataplane's sync after an endpoint change, with the deletion of the flow's
	// conntrack entries. kube-proxy's syncs are minSyncPeriod (1 s by default) apart,
	// and a backend's removal comes right after the sync that added its successor:
	// it moved the flow up to 1.13 s after the update (refdp: before the suite saw
	// it); the budget is that period twice, for a busy node's slower syncs.
	UDPRepoint time.Duration `budget:"udp-repoint"`
	// EndpointProgrammed is how soon after the EndpointSlices of a TCP Service change
	// its new connections must follow them (SVC-ENDPOINT-CHURN): a backend that
	// stopped being ready takes none from then on, and one that was added takes some.
	// It is udp-repoint's reasoning for the same sync: kube-proxy's syncs are
	// minSyncPeriod (1 s by default) apart, and a removal that comes right after the
	// sync that added its successor waits for the next; the budget is that period
	// twice.
	EndpointProgrammed time.Duration `budget:"endpoint-programmed"`
	// Ready bounds every wait for an agent to report ready, at set-up and after each
	// start of a transition. An agent that is not ready by then fails the spec. The
	// real kube-proxy a ModeSwitch spec starts with is not bounded by it
	// (harness.KubeProxyReadyTimeout).
	Ready time.Duration `budget:"ready"`
	// Programmed bounds the wait for a new Service to carry traffic once its
	// EndpointSlices list its backends (implementations program asynchronously, and
	// that is not what the specs measure).
	Programmed time.Duration `budget:"programmed"`
	// SwitchMaxGap is the longest a stream may stall while a node switches from
	// kube-proxy to the implementation; SwitchSettle is how long after ready a switch
	// is watched (streams must still be alive then).
	SwitchMaxGap time.Duration `budget:"switch-max-gap"`
	SwitchSettle time.Duration `budget:"switch-settle"`
	// WarmStreak is how many new connections in a row must reach the right backend for
	// a flow to count as programmed; WarmInterval is their period.
	WarmStreak   int           `budget:"warm-streak"`
	WarmInterval time.Duration `budget:"warm-interval" probe:"schedule"`
	// ControlInterval is the period of the control flow, which crosses no dataplane
	// and watches the environment; ControlMaxBlind is its blind limit.
	ControlInterval time.Duration `budget:"control-interval" probe:"schedule"`
	ControlMaxBlind time.Duration `budget:"control-max-blind"`
	// PolicyProgrammed bounds the wait, after a policy case's NetworkPolicies are
	// written, for the observed connectivity to match the expected (implementations
	// program asynchronously; the ordering specs measure that window, the truth table
	// does not). ReachTimeout is how long one truth-table attempt waits for its reply:
	// a denied cell costs it, so it is short, and a cell that misses it is probed again
	// within PolicyProgrammed.
	PolicyProgrammed time.Duration `budget:"policy-programmed"`
	ReachTimeout     time.Duration `budget:"reach-timeout"`
	// AddressProgrammed bounds how long after an address is added to a node's
	// interface its NodePorts may take to answer on it, and after the address is
	// removed, to stop answering (NODE-ADDRESS-CHANGE). kube-proxy matches NodePorts
	// by the kernel's own view of local addresses and needs no time; a dataplane
	// that watches the addresses (refdp, netlink) takes a round, a few ms; one that
	// polls them takes up to its period.
	AddressProgrammed time.Duration `budget:"address-programmed"`
	// OrderInterval is the period of the ordering specs' probes (a new pod's
	// datagrams, a client's new connections while its policy is replaced): their
	// windows can be a few milliseconds, and a finer probe catches a shorter one.
	OrderInterval time.Duration `budget:"order-interval" probe:"schedule"`
	// SNATChurn is how long SVC-SNAT-PRESSURE's short connections churn source ports
	// through a NodePort to a remote backend, at one per ConnectInterval, while its
	// streams run: long enough that a dataplane's SNAT port range fills and its ports
	// are reused (refdp's 4,536 ports, at 2 ms, are all taken after some 10 s).
	SNATChurn time.Duration `budget:"snat-churn"`
	// SNATRetryPerMille is how many of every 1,000 of SVC-SNAT-PRESSURE's short
	// connections may time out (none may be reset or refused). At hundreds of
	// connections a second every SNAT port is reused while the backend still holds
	// the port's last connection in TIME_WAIT (60 s); PAWS rejects the new SYN there
	// about a third of the time, and now and then the client's SYN gets through only
	// on its retry after the 1 s initial RTO: 0 to 2 of 19,000 against the clean
	// reference (docs/faults.md). A dataplane that runs out of ports or takes a live
	// flow's fails thousands.
	SNATRetryPerMille int `budget:"snat-retry-per-mille"`
	// ClockUncertainty is the most the suite allows a host's clock to be uncertain
	// where the hosts read clocks of their own (a cluster of separate machines; the
	// netns topology's clock skew): the bound the suite measures on each host's
	// offset, with the drift over the run, must be under it, or the run is an error
	// of its environment. Every time a check allows after a transition event is
	// longer by it (matchers.ClockUncertainty), and a spec with a budget under ten
	// times it is refused, since the uncertainty would be a tenth of what it judges.
	// Nothing of it applies where every host reads the suite's clock.
	ClockUncertainty time.Duration `budget:"clock-uncertainty"`
}

// DefaultBudgets are the budgets of the spec catalogue (docs/specs.md).
var DefaultBudgets = Budgets{
	Lead:               time.Second,
	Settle:             3 * time.Second,
	SteadyState:        time.Second,
	ConnectInterval:    2 * time.Millisecond,
	AttemptTimeout:     time.Second,
	MaxBlind:           250 * time.Millisecond,
	StreamInterval:     5 * time.Millisecond,
	StreamMaxGap:       200 * time.Millisecond,
	AliveWithin:        500 * time.Millisecond,
	EndWithin:          2 * time.Second,
	ReconcileWithin:    time.Second,
	UDPRepoint:         2 * time.Second,
	EndpointProgrammed: 2 * time.Second,
	Ready:              60 * time.Second,
	Programmed:         10 * time.Second,
	SwitchMaxGap:       time.Second,
	SwitchSettle:       5 * time.Second,
	WarmStreak:         20,
	WarmInterval:       10 * time.Millisecond,
	ControlInterval:    10 * time.Millisecond,
	ControlMaxBlind:    time.Second,
	PolicyProgrammed:   5 * time.Second,
	ReachTimeout:       200 * time.Millisecond,
	OrderInterval:      250 * time.Microsecond,
	AddressProgrammed:  time.Second,
	SNATChurn:          time.Minute,
	SNATRetryPerMille:  1,
	ClockUncertainty:   5 * time.Millisecond,
}

// Set overrides one budget by its name ("stream-max-gap=300ms", "warm-streak=50").
func (b *Budgets) Set(assignment string) error {
	name, value, ok := strings.Cut(assignment, "=")
	if !ok {
		return fmt.Errorf("budget %q: want name=value, e.g. ready=90s (budgets: %s)", assignment, strings.Join(BudgetNames(), ", "))
	}
	nb := *b
	v := reflect.ValueOf(&nb).Elem()
	for i := 0; i < v.NumField(); i++ {
		if v.Type().Field(i).Tag.Get("budget") != name {
			continue
		}
		f := v.Field(i)
		switch f.Interface().(type) {
		case time.Duration:
			d, err := time.ParseDuration(value)
			if err != nil || d <= 0 {
				return fmt.Errorf("budget %s=%s: want a positive duration such as 500ms or 2s", name, value)
			}
			f.SetInt(int64(d))
		case int:
			n, err := strconv.Atoi(value)
			if err != nil || n <= 0 {
				return fmt.Errorf("budget %s=%s: want a positive whole number", name, value)
			}
			f.SetInt(int64(n))
		}
		if err := nb.Validate(); err != nil {
			return err
		}
		*b = nb
		return nil
	}
	return fmt.Errorf("unknown budget %q; budgets: %s", name, strings.Join(BudgetNames(), ", "))
}

// Validate refuses budgets a run cannot keep: a probe's schedule (a budget tagged
// probe:"schedule") shorter than the shortest a probe runs, which would otherwise be
// found only when the spec's first probe started, after its world was set up.
func (b Budgets) Validate() error {
	v := reflect.ValueOf(b)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if t.Field(i).Tag.Get("probe") != "schedule" {
			continue
		}
		if d := time.Duration(v.Field(i).Int()); d < probe.MinInterval {
			return fmt.Errorf("budget %s=%s: a probe's schedule cannot be shorter than %s; set it to %s or more", t.Field(i).Tag.Get("budget"), d, probe.MinInterval, probe.MinInterval)
		}
	}
	return nil
}

// ClockRefusal names the first of the budgets names (a spec's Budgets) that is a time
// a check judges and is under ten times the clock-uncertainty budget, with the
// figures, or "" if none is. A probe's schedule is not judged, and so is not refused.
func (b Budgets) ClockRefusal(names []string) string {
	v := reflect.ValueOf(b)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name := t.Field(i).Tag.Get("budget")
		if !slices.Contains(names, name) || t.Field(i).Tag.Get("probe") == "schedule" {
			continue
		}
		d, ok := v.Field(i).Interface().(time.Duration)
		if ok && d < 10*b.ClockUncertainty {
			return fmt.Sprintf("budget %s=%s is under ten times clock-uncertainty=%s", name, d, b.ClockUncertainty)
		}
	}
	return ""
}

// BudgetNames lists the budgets' names, in their order in Budgets.
func BudgetNames() []string {
	t := reflect.TypeOf(Budgets{})
	names := make([]string, t.NumField())
	for i := range names {
		names[i] = t.Field(i).Tag.Get("budget")
	}
	return names
}

// Values returns every budget by name, as the report records them.
func (b Budgets) Values() map[string]string {
	v := reflect.ValueOf(b)
	out := map[string]string{}
	for i, name := range BudgetNames() {
		out[name] = fmt.Sprint(v.Field(i).Interface())
	}
	return out
}

// Overridden lists the budgets that differ from DefaultBudgets, as name=value, sorted.
func (b Budgets) Overridden() []string {
	def, got := DefaultBudgets.Values(), b.Values()
	var out []string
	for name, v := range got {
		if def[name] != v {
			out = append(out, name+"="+v)
		}
	}
	slices.Sort(out)
	return out
}
