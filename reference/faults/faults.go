// Package faults lists the named defects the reference dataplane can reintroduce, each
// a known bug of a real dataplane. They are off by default and exist only for the
// suite's self-test: every conformance spec must fail against the fault it names.
// docs/faults.md describes each with its origin.
package faults

import (
	"fmt"
	"sort"
	"strings"
)

// Fault names.
const (
	// EagerServiceSync: the service syncer applies (and deletes) before the host IPs
	// are known, and host-IP discovery reports a few hundred ms after that first
	// apply, so NodePort frontends of the previous run are erased for that long
	// (Calico issue 12192).
	EagerServiceSync = "eager-service-sync"
	// FlushNATOnStart: the agent empties the NAT maps when it starts.
	FlushNATOnStart = "flush-nat-on-start"
	// UnpinnedConntrack: the conntrack map is not pinned, so a restart loses it.
	UnpinnedConntrack = "unpinned-conntrack"
	// RebuildBackendsInPlace: a service whose backends change is deleted and re-created
	// in place: its backend slots are emptied and rewritten under its frontends, and the
	// conntrack entries of its flows are dropped with it, so established flows to the
	// backends that stay lose their NAT state.
	RebuildBackendsInPlace = "rebuild-backends-in-place"
	// FrontendsBeforeBackends: a service whose backends change gets a fresh service
	// ID, but its frontends are switched to it before its backends are written, so a
	// new connection that arrives in between finds its frontend and no backend, and
	// is dropped: the reverse of make-before-break, for as long as the backend writes
	// take.
	FrontendsBeforeBackends = "frontends-before-backends"
	// KeepUDPConntrackOnBackendRemoval: when a backend leaves a Service, the agent
	// does not delete the conntrack entries of the UDP flows DNATed to it, so a UDP
	// client that keeps its 5-tuple goes on being sent to the removed backend, a
	// blackhole, for as long as it keeps sending (kubernetes issue 59368, the stale
	// UDP conntrack kube-proxy deletes).
	KeepUDPConntrackOnBackendRemoval = "keep-udp-conntrack-on-backend-removal"
	// ServeNotReadyEndpoints: the agent takes every endpoint the EndpointSlices list
	// as a backend, ready or not, so a terminating pod (ready false) goes on taking new
	// connections until its endpoint goes, and they fail once its process stops: the
	// omission of load balancers that do not read the ready condition
	// (ovn-kubernetes PR 3240, nghttpx-ingress-lb PR 157).
	ServeNotReadyEndpoints = "serve-not-ready-endpoints"
	// KeepFlowsToGoneBackends: when a TCP backend's endpoint is gone (its pod
	// deleted, not merely terminating), the agent does not flag the conntrack entries
	// of the flows DNATed to it, so a backend that vanished without closing its
	// connections (a lost sandbox or node) leaves their clients retransmitting into
	// silence until their own timeout: what kube-proxy does.
	KeepFlowsToGoneBackends = "keep-flows-to-gone-backends"
	// NoForwardFallthroughAccept: FORWARD lacks the accept for fallthrough packets of
	// flows the Linux stack's conntrack knows (INPUT keeps its own), so a flow that
	// predates the datapath and is forwarded from the host interface back out of it,
	// a NodePort flow to a remote backend, is dropped by a FORWARD policy DROP once
	// kube-proxy's KUBE-FORWARD accept is gone (Calico PR 13778).
	NoForwardFallthroughAccept = "no-forward-fallthrough-accept"
	// NoKubeProxyCleanup: the agent never removes kube-proxy's rules, so kube-proxy's
	// service chains stay on the node and keep NATing what the datapath passes on.
	NoKubeProxyCleanup = "no-kube-proxy-cleanup"
	// CleanupBeforeAttach: the agent removes kube-proxy's rules first thing at start,
	// before its programs are attached and its services written, so that new
	// connections meanwhile find neither kube-proxy's NAT nor the datapath's.
	CleanupBeforeAttach = "cleanup-before-attach"
	// FlushConntrackOnTakeover: taking over from kube-proxy, the agent also "cleans up"
	// the Linux conntrack table kube-proxy's NAT filled, so every flow that predates
	// the datapath loses the NAT state its next packets need.
	FlushConntrackOnTakeover = "flush-conntrack-on-takeover"
	// DropClusterIPFrontendsOnStart: on start the agent adopts only the frontends it
	// can attribute to the node (those on its host IPs: NodePorts) and deletes the
	// rest, the ClusterIPs, which it writes again only at its first complete sync.
	DropClusterIPFrontendsOnStart = "drop-clusterip-frontends-on-start"
	// IgnoreIPBlockExcept: the policy compiler drops ipBlock.except, so an ipBlock
	// peer's set holds its whole cidr and the carved-out addresses are admitted too.
	IgnoreIPBlockExcept = "ignore-ipblock-except"
	// NamedPortsUnresolved: the policy compiler does not resolve named ports: a rule
	// port given by name (e.g. "http") is skipped, so the rule admits nothing on it,
	// and traffic a named-port rule allows is dropped.
	NamedPortsUnresolved = "named-ports-unresolved"
	// EgressIgnoresPorts: the policy compiler builds egress rules without their
	// ports, so a pod isolated for egress may reach an allowed peer on any port and
	// protocol.
	EgressIgnoresPorts = "egress-ignores-ports"
	// AttachBeforeIPSets: a round attaches new endpoints (with their own policy) and
	// opens their iptables gates before it writes the IP sets, and writes the policy
	// of the endpoints that exist last, so a same-node peer whose ingress policy
	// admits a new pod by label still judges it against its old set, without the
	// pod's IP, and denies the pod's first packets while the pod already reaches
	// unpoliced peers (Calico PR 12164, spurious denies for new workloads).
	AttachBeforeIPSets = "attach-before-ipsets"
	// RedirectBeforePolicy: a new endpoint's programs are attached and its gate
	// opened without its policy, which is written only after iptables, so a new pod
	// whose egress policy denies a destination reaches it meanwhile, and a flow it
	// opened meanwhile stays admitted (Calico issue 6241: traffic redirected to a
	// workload before its policy was attached, an attach gap that fails open).
	RedirectBeforePolicy = "redirect-before-policy"
	// DeleteThenAddPolicy: the agent's view of NetworkPolicies takes an update as a
	// delete and then an add, each applied in a round of its own, so for one round
	// the pods the policy selects have only their other policies (a default deny,
	// say): new connections that both versions allow are denied meanwhile.
	DeleteThenAddPolicy = "delete-then-add-policy"
	// OpenWhileRestarting: on start the agent "adopts" the endpoints it finds pinned
	// by re-attaching each from scratch, state rewritten from pod IP and flags alone,
	// without its policy, before its view is complete, so every endpoint is unpoliced
	// from the agent's start until its first complete round writes policy again.
	OpenWhileRestarting = "open-while-restarting"
	// HostSeenBeforeGates: FORWARD accepts the packets the host interface's programs
	// marked as handled before the workload gates: traffic from another node (it
	// crossed the host interface's programs first) reaches a new pod before the
	// agent has attached the pod's programs and policy, while traffic from a pod on
	// the same node still meets the gate.
	HostSeenBeforeGates = "host-seen-before-gates"
	// UngatedOnEveryStart: the agent writes its chains without the workload gates at
	// every start, as it must only at its first on a node (where the pods predate it
	// and ran unfiltered), so a pod created while it was down, which no program of
	// it polices yet, is forwarded by plain routing from the agent's start until its
	// first complete round attaches the pod and closes the gates again.
	UngatedOnEveryStart = "ungated-on-every-start"
	// ReadyBeforeFirstApply: the agent reports ready as soon as it has adopted the
	// pinned datapath, which keeps forwarding ("healthy while starting up", as
	// kube-proxy's /healthz is), before its first complete round has written what the
	// API holds: from ready until that round the datapath is still programmed with the
	// world as it was when the agent stopped.
	ReadyBeforeFirstApply = "ready-before-first-apply"
	// AdoptWithoutReconcile: on start the pinned service maps are adopted and the
	// rounds write only what the API adds or changes; what was deleted while the agent
	// was down (a Service, a backend set) is deleted only once a Service or
	// EndpointSlice changes after the informers' initial list, as an agent whose
	// deletions are driven by delete events never sees one for an object that went
	// while it was not watching.
	AdoptWithoutReconcile = "adopt-without-reconcile"
	// HostIPsReadOnce: the agent lists the host interface's addresses once, at
	// start, and never watches them, so a NodePort is never served on an address
	// added later (and stays on one removed).
	HostIPsReadOnce = "host-ips-read-once"
	// HostIPRemovalsIgnored: the host-address watcher acts on new addresses only,
	// so the NodePort frontends of a removed address stay, and keep answering the
	// clients that still send to it, until some address is added.
	HostIPRemovalsIgnored = "host-ip-removals-ignored"
	// SNATPortUnchecked: a new NodePort flow to a remote backend that finds none of
	// its SNAT port candidates free takes over the first one without checking that
	// the flow holding it is over (closed and quiet, or idle), so once a minute of
	// short connections has filled the port range a new flow steals the port of a
	// live stream, whose replies then go to the new flow's client: the stream
	// stalls, and the new connection meets the old one's state at the backend.
	SNATPortUnchecked = "snat-port-unchecked"
	// CTCopyBeforeAttach: on a start that changes the conntrack map (another size
	// or version), the agent copies the previous map into the new one, and drops
	// it, before it attaches the new programs: what the previous run's programs,
	// still attached, write in between (the new flows of that window) is lost
	// (the review point of Calico PR 12164: copy after the attach).
	CTCopyBeforeAttach = "ct-copy-before-attach"
	// NoCTMigration: a start that changes the conntrack map drops the previous
	// map without copying it: every flow that needs its conntrack entry (NAT)
	// breaks on the upgrade.
	NoCTMigration = "no-ct-migration"
	// NoCTMirror: while a previous conntrack map is being migrated, the new
	// programs do not write what they create into it, so a flow that a new
	// program opens on one hook is unknown to an old program still attached on
	// another: in the moment between the attach of an interface's two programs,
	// a SYN-ACK leaves unNATed and the client resets it.
	NoCTMirror = "no-ct-mirror"
)

var known = map[string]string{
	EagerServiceSync:                 "service syncer applies before host IPs are known; host-IP discovery is late (Calico 12192)",
	FlushNATOnStart:                  "the agent empties the NAT frontend and backend maps when it starts",
	UnpinnedConntrack:                "conntrack state does not survive an agent restart",
	RebuildBackendsInPlace:           "a backend change deletes and re-creates the service in place, conntrack entries included",
	FrontendsBeforeBackends:          "a changed service's frontends are switched to its fresh service ID before its backends are written",
	KeepUDPConntrackOnBackendRemoval: "UDP flows to a backend removed from a Service keep their conntrack entries, and go on to it",
	ServeNotReadyEndpoints:           "endpoints that are not ready (terminating) stay backends for new connections",
	KeepFlowsToGoneBackends:          "TCP flows to a backend whose endpoint is gone are not reset: a client of a vanished pod hangs",
	NoForwardFallthroughAccept:       "FORWARD has no accept for fallthrough packets of flows Linux conntrack knows (Calico PR 13778)",
	NoKubeProxyCleanup:               "kube-proxy's rules are never removed",
	CleanupBeforeAttach:              "kube-proxy's rules are removed at start, before programs are attached and services written",
	FlushConntrackOnTakeover:         "taking over from kube-proxy flushes the Linux conntrack table its NAT filled",
	DropClusterIPFrontendsOnStart:    "on start the agent keeps only the frontends on its host IPs and deletes the ClusterIPs until its first sync",
	IgnoreIPBlockExcept:              "the policy compiler drops ipBlock.except: the whole cidr is admitted",
	NamedPortsUnresolved:             "the policy compiler skips ports given by name: a named-port rule admits nothing on them",
	EgressIgnoresPorts:               "the policy compiler builds egress rules without their ports: any port to an allowed peer",
	AttachBeforeIPSets:               "new endpoints attached and their gates opened before the IP sets and their peers' policies are written (Calico PR 12164)",
	RedirectBeforePolicy:             "new endpoints attached and their gates opened without their policy, written only after iptables (Calico 6241)",
	DeleteThenAddPolicy:              "a NetworkPolicy update is applied as a delete and an add, each in its own round",
	OpenWhileRestarting:              "on start every pinned endpoint is re-attached from scratch without policy, until the first complete round",
	HostSeenBeforeGates:              "FORWARD accepts what the host interface's programs handled before the gates: another node's traffic reaches a pod not yet programmed",
	UngatedOnEveryStart:              "the chains are written without the workload gates at every start: a pod created while the agent was down is unpoliced until its first round",
	ReadyBeforeFirstApply:            "the agent reports ready once it has adopted the pinned datapath, before its first complete round writes what the API holds",
	AdoptWithoutReconcile:            "pinned service maps adopted on start; what was deleted while down stays until a Service or EndpointSlice changes",
	HostIPsReadOnce:                  "host IPs read once at start and never watched: no NodePort on an address added later",
	HostIPRemovalsIgnored:            "the host-address watcher ignores removals: a removed address keeps its NodePort frontends",
	SNATPortUnchecked:                "with no free SNAT port, a new NodePort flow takes over its first candidate without checking the flow holding it is over",
	CTCopyBeforeAttach:               "a resized or upgraded conntrack map is copied before the new programs are attached: what the old programs write meanwhile is lost",
	NoCTMigration:                    "a resized or upgraded conntrack map starts empty: the previous one is dropped, not migrated",
	NoCTMirror:                       "during a conntrack migration the new programs do not mirror new flows into the previous map: an old program on the other hook of an interface misses them",
}

// Set is a set of enabled faults.
type Set map[string]bool

// Parse builds a Set from names, rejecting unknown ones with the list of known faults.
func Parse(names []string) (Set, error) {
	s := Set{}
	for _, n := range names {
		for _, part := range strings.Split(n, ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			if _, ok := known[part]; !ok {
				return nil, fmt.Errorf("unknown fault %q; known faults: %s", part, strings.Join(Known(), ", "))
			}
			s[part] = true
		}
	}
	return s, nil
}

// Has reports whether fault name is enabled.
func (s Set) Has(name string) bool { return s[name] }

// Names returns the enabled faults, sorted.
func (s Set) Names() []string {
	out := make([]string, 0, len(s))
	for n := range s {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Known returns every fault's name, sorted.
func Known() []string {
	out := make([]string, 0, len(known))
	for n := range known {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Describe returns a one-line description of a fault.
func Describe(name string) string { return known[name] }
