// Package policy compiles Kubernetes NetworkPolicies (networking.k8s.io/v1) into the
// reference datapath's policy state, and writes that state to its maps.
//
// The compiler (Compiler.Compile) is pure: from every policy, pod and namespace of the
// cluster and the node's local endpoints it computes IP sets and, per endpoint, the
// rules of each direction. A rule allows a peer set (0: any peer) on a port range and
// protocol; an endpoint is isolated in a direction when a policy that selects it has
// that type, and then admits only what one of its rules allows. Sets are deduplicated
// by content, so thousands of endpoints whose rules select the same peers share one
// set, and a set keeps its ID from round to round while its content is unchanged. A
// set's content never changes under its ID: new content gets a new ID, which lets the
// Syncer switch an endpoint from one set to the next make-before-break.
//
// Named ports are resolved per pod: an ingress rule's against the endpoint's own
// containers, an egress rule's against each destination pod's, so that an egress rule
// on a named port becomes one rule per distinct (port, protocol) it resolves to, each
// with the set of the peer pods that declare it.
//
// The datapath is IPv4-only; IPv6 pods and ipBlocks are left out.
package policy

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dpconform/dpconform/bpf"
)

// Entry is one prefix of an IP set: a member, or carved out of the set's members.
type Entry struct {
	Prefix netip.Prefix
	Except bool
}

// Set is an IP set's content: its entries ordered by prefix, each prefix once.
type Set []Entry

// Input is the cluster as the compiler needs it.
type Input struct {
	Policies   []*networkingv1.NetworkPolicy
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	// Endpoints maps the "namespace/name" of each pod whose endpoint this node
	// programs to its interface's index.
	Endpoints map[string]int
}

// Desired is the compiled state.
type Desired struct {
	// Sets are the IP sets the endpoints' rules refer to, by ID.
	Sets map[uint32]Set
	// Endpoints holds a policy for every endpoint of the Input, by ifindex. Replicas
	// (same namespace, labels and ports) share their rule slices: read, never modify.
	Endpoints map[int]bpf.EndpointPolicy
}

// Options configure a Compiler.
type Options struct {
	// MaxRules is the most rules an endpoint may have in one direction
	// (0: bpf.MaxPolicyRules). An endpoint that would need more is isolated in that
	// direction with no rule: it fails closed.
	MaxRules int
	// IgnoreIPBlockExcept is the fault "ignore-ipblock-except": an ipBlock's set
	// holds its cidr and none of its except prefixes.
	IgnoreIPBlockExcept bool
	// NamedPortsUnresolved is the fault "named-ports-unresolved": a port given by
	// name is skipped, so a rule admits nothing on it.
	NamedPortsUnresolved bool
	// EgressIgnoresPorts is the fault "egress-ignores-ports": egress rules are
	// compiled without their ports, so they admit any port to an allowed peer.
	EgressIgnoresPorts bool
}

// metadataNameLabel is set on every namespace by the API server; it is treated as set
// even where the Namespace object lacks it (or is not known yet).
const metadataNameLabel = "kubernetes.io/metadata.name"

// Compiler compiles rounds of Input, keeping set IDs stable between them.
type Compiler struct {
	opts Options
	// ids are the set IDs of the last round (or adopted), by content key.
	ids map[string]uint32
	// parsed are the last round's selectors.
	parsed map[*metav1.LabelSelector]parsedSelector
	// last is the highest ID ever given out: IDs are never reused, so an ID that a
	// failed write left referenced cannot come back with other content.
	last uint32
}

// NewCompiler returns a Compiler with no sets.
func NewCompiler(opts Options) *Compiler {
	if opts.MaxRules == 0 {
		opts.MaxRules = bpf.MaxPolicyRules
	}
	return &Compiler{opts: opts, ids: map[string]uint32{}}
}

// Adopt takes over the IDs of sets the datapath already holds (a previous run's), so
// that the next round reuses the ID of every set whose content it still wants and
// rewrites nothing for it. Call it before the first Compile.
func (c *Compiler) Adopt(sets map[uint32]Set) {
	ids := slices.Sorted(func(yield func(uint32) bool) {
		for id := range sets {
			if !yield(id) {
				return
			}
		}
	})
	for _, id := range ids {
		c.last = max(c.last, id)
		k := key(canonical(sets[id]))
		if _, ok := c.ids[k]; !ok {
			c.ids[k] = id
		}
	}
}

// Compile computes the desired state for in. Its error lists what could not be
// compiled as written (an invalid selector, an endpoint over MaxRules); the Desired
// state is complete all the same, each such part failing closed.
func (c *Compiler) Compile(in Input) (Desired, error) {
	r := newRound(c, in)
	d := Desired{Sets: map[uint32]Set{}, Endpoints: make(map[int]bpf.EndpointPolicy, len(in.Endpoints))}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range in.Endpoints {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		ifindex := in.Endpoints[k]
		d.Endpoints[ifindex] = r.endpoint(k)
	}
	// Only the sets the endpoints refer to are desired: a policy that selects no
	// local endpoint costs nothing.
	for _, ep := range d.Endpoints {
		for _, rules := range [][]bpf.PolicyRule{ep.Ingress, ep.Egress} {
			for _, rl := range rules {
				if rl.SetID != 0 {
					d.Sets[rl.SetID] = r.sets[rl.SetID]
				}
			}
		}
	}
	c.parsed = r.parsed
	c.ids = map[string]uint32{}
	for k, id := range r.ids {
		if _, ok := d.Sets[id]; ok {
			c.ids[k] = id
		}
	}
	return d, errors.Join(r.errs...)
}

// pod is a pod as a peer and as an endpoint.
type pod struct {
	namespace string
	labels    labels.Set
	ip        netip.Addr // invalid: not a peer (no IPv4 pod IP, host network, terminated)
	idx       int        // a peer's rank in the order of IPs
	// signature is the same for pods that no policy can tell apart as endpoints:
	// namespace, labels and container ports.
	signature string
	ports     []corev1.ContainerPort
}

// round is one Compile's working state.
type round struct {
	c        *Compiler
	opts     Options
	ns       map[string]labels.Set
	pods     map[string]*pod   // by "namespace/name"
	byNS     map[string][]*pod // peers by namespace
	peers    []*pod            // every peer
	byPol    map[string][]*networkingv1.NetworkPolicy
	podSel   map[*networkingv1.NetworkPolicy]labels.Selector
	comp     map[*networkingv1.NetworkPolicy]*compiled // policies that select a local endpoint
	selMem   map[string][]*pod                         // selectors' pods, by selector key
	peersMem map[string]*peers                         // rules' peers, by peers key
	namedMem map[string][]bpf.PolicyRule               // named egress ports' rules, by peers key and port
	epMem    map[string]bpf.EndpointPolicy             // endpoints' policies, by pod signature
	ids      map[string]uint32                         // this round's set IDs, by content key
	sets     map[uint32]Set
	parsed   map[*metav1.LabelSelector]parsedSelector
	errs     []error
}

func newRound(c *Compiler, in Input) *round {
	r := &round{
		c: c, opts: c.opts,
		ns:       make(map[string]labels.Set, len(in.Namespaces)),
		pods:     make(map[string]*pod, len(in.Pods)),
		byNS:     map[string][]*pod{},
		byPol:    map[string][]*networkingv1.NetworkPolicy{},
		podSel:   map[*networkingv1.NetworkPolicy]labels.Selector{},
		comp:     map[*networkingv1.NetworkPolicy]*compiled{},
		selMem:   map[string][]*pod{},
		peersMem: map[string]*peers{},
		namedMem: map[string][]bpf.PolicyRule{},
		epMem:    map[string]bpf.EndpointPolicy{},
		parsed:   map[*metav1.LabelSelector]parsedSelector{},
		ids:      map[string]uint32{},
		sets:     map[uint32]Set{},
	}
	for _, n := range in.Namespaces {
		l := make(labels.Set, len(n.Labels)+1)
		for k, v := range n.Labels {
			l[k] = v
		}
		l[metadataNameLabel] = n.Name
		r.ns[n.Name] = l
	}
	for _, p := range in.Pods {
		if _, ok := r.ns[p.Namespace]; !ok {
			r.ns[p.Namespace] = labels.Set{metadataNameLabel: p.Namespace}
		}
		pp := &pod{namespace: p.Namespace, labels: labels.Set(p.Labels)}
		for _, c := range p.Spec.Containers {
			pp.ports = append(pp.ports, c.Ports...)
		}
		pp.signature = signature(p.Namespace, pp.labels, pp.ports)
		if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil && ip.Is4() && !p.Spec.HostNetwork &&
			p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			pp.ip = ip
			r.byNS[p.Namespace] = append(r.byNS[p.Namespace], pp)
			r.peers = append(r.peers, pp)
		}
		r.pods[p.Namespace+"/"+p.Name] = pp
	}
	slices.SortFunc(r.peers, func(a, b *pod) int { return a.ip.Compare(b.ip) })
	for i, pp := range r.peers {
		pp.idx = i
	}
	for _, np := range in.Policies {
		r.byPol[np.Namespace] = append(r.byPol[np.Namespace], np)
	}
	return r
}

func signature(ns string, l labels.Set, ports []corev1.ContainerPort) string {
	var b strings.Builder
	b.WriteString(ns)
	b.WriteByte(0)
	b.WriteString(l.String())
	for _, p := range ports {
		b.WriteByte(0)
		b.WriteString(p.Name)
		b.WriteByte('/')
		b.WriteString(string(p.Protocol))
		b.WriteByte('/')
		b.WriteString(strconv.Itoa(int(p.ContainerPort)))
	}
	return b.String()
}

// endpoint compiles the policy of the local pod with this key.
func (r *round) endpoint(podKey string) bpf.EndpointPolicy {
	var ep bpf.EndpointPolicy
	p := r.pods[podKey]
	if p == nil {
		// Not in the datastore: nothing selects it.
		return ep
	}
	// The replicas of a workload share labels and ports, and with them their policy.
	if ep, ok := r.epMem[p.signature]; ok {
		return ep
	}
	defer func() { r.epMem[p.signature] = ep }()
	for _, np := range r.byPol[p.namespace] {
		if !r.selects(np, p) {
			continue
		}
		cp := r.compiled(np)
		if cp.ingress {
			ep.IngressIsolated = true
			for _, t := range cp.in {
				ep.Ingress = append(ep.Ingress, r.ingressRules(t, p)...)
			}
		}
		if cp.egress {
			ep.EgressIsolated = true
			ep.Egress = append(ep.Egress, cp.out...)
		}
	}
	ep.Ingress, ep.Egress = normalize(ep.Ingress), normalize(ep.Egress)
	if len(ep.Ingress) > r.opts.MaxRules {
		// Replicas get the same policy, and no error of their own.
		r.errs = append(r.errs, fmt.Errorf("pod %s: %d ingress rules, more than the datapath's %d: it admits no ingress", podKey, len(ep.Ingress), r.opts.MaxRules))
		ep.Ingress = nil
	}
	if len(ep.Egress) > r.opts.MaxRules {
		r.errs = append(r.errs, fmt.Errorf("pod %s: %d egress rules, more than the datapath's %d: it admits no egress", podKey, len(ep.Egress), r.opts.MaxRules))
		ep.Egress = nil
	}
	return ep
}

// normalize orders rules and drops duplicates.
func normalize(rules []bpf.PolicyRule) []bpf.PolicyRule {
	slices.SortFunc(rules, func(a, b bpf.PolicyRule) int {
		return cmp.Or(cmp.Compare(a.SetID, b.SetID), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.PortMin, b.PortMin), cmp.Compare(a.PortMax, b.PortMax))
	})
	return slices.Compact(rules)
}

// selects reports whether np applies to pod p (of np's namespace).
func (r *round) selects(np *networkingv1.NetworkPolicy, p *pod) bool {
	sel, ok := r.podSel[np]
	if !ok {
		var err error
		if sel, err = r.asSelector(&np.Spec.PodSelector); err != nil {
			r.errs = append(r.errs, fmt.Errorf("networkpolicy %s/%s: podSelector: %w: it selects no pod", np.Namespace, np.Name, err))
			sel = labels.Nothing()
		}
		r.podSel[np] = sel
	}
	return sel.Matches(p.labels)
}

// compiled is a policy compiled as far as it can be without the endpoint it applies
// to: ingress named ports resolve against the endpoint's own pod.
type compiled struct {
	ingress, egress bool
	in              []ingressRule
	out             []bpf.PolicyRule
}

// ingressRule is an ingress rule whose peers are compiled.
type ingressRule struct {
	sets  []uint32 // 0: any peer; empty: no peer exists, the rule admits nothing
	ports []networkingv1.NetworkPolicyPort
}

func (r *round) compiled(np *networkingv1.NetworkPolicy) *compiled {
	if cp, ok := r.comp[np]; ok {
		return cp
	}
	cp := &compiled{}
	r.comp[np] = cp
	cp.ingress, cp.egress = policyTypes(&np.Spec)
	if cp.ingress {
		for _, rule := range np.Spec.Ingress {
			peers := r.peerSets(np, rule.From)
			cp.in = append(cp.in, ingressRule{sets: peers.ids(), ports: rule.Ports})
		}
	}
	if cp.egress {
		for _, rule := range np.Spec.Egress {
			cp.out = append(cp.out, r.egressRules(np, rule)...)
		}
	}
	return cp
}

// policyTypes returns the policy's types, defaulted as the API server does when none
// is given: Ingress always, Egress if the policy has egress rules.
func policyTypes(spec *networkingv1.NetworkPolicySpec) (ingress, egress bool) {
	if len(spec.PolicyTypes) == 0 {
		return true, len(spec.Egress) > 0
	}
	for _, t := range spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// peers is a rule's compiled peers.
type peers struct {
	// key identifies the peers within the round (equal keys, equal peers).
	key string
	any bool
	// selected are the pods its podSelector and namespaceSelector peers select, each
	// once, and selectedSet their set (0: none).
	selected    []*pod
	selectedSet uint32
	// blocks are its IPv4 ipBlocks and blockSets their sets.
	blocks    []ipBlock
	blockSets []uint32
}

var anyPeer = &peers{key: "any", any: true}

type ipBlock struct {
	cidr   netip.Prefix
	except []netip.Prefix
}

// contains reports whether a is in the block and in none of its except prefixes.
func (b ipBlock) contains(a netip.Addr) bool {
	if !b.cidr.Contains(a) {
		return false
	}
	for _, e := range b.except {
		if e.Contains(a) {
			return false
		}
	}
	return true
}

func (b ipBlock) String() string { return fmt.Sprint(b.cidr, b.except) }

// ids returns the sets a rule's peers match: [0] for any peer.
func (p *peers) ids() []uint32 {
	if p.any {
		return []uint32{0}
	}
	out := slices.Clone(p.blockSets)
	if p.selectedSet != 0 {
		out = append(out, p.selectedSet)
	}
	return out
}

// selector is a podSelector and/or namespaceSelector peer of a policy in namespace
// ns: the pods pod matches (all if nil) in the namespaces ns matches (the policy's
// alone if nil).
type selector struct {
	key     string
	pod, ns labels.Selector
	policy  string
}

// peerSets compiles the from or to list of one of np's rules. Policies often repeat
// their peers: each distinct list is compiled once per round.
func (r *round) peerSets(np *networkingv1.NetworkPolicy, list []networkingv1.NetworkPolicyPeer) *peers {
	if len(list) == 0 {
		return anyPeer
	}
	var (
		key    strings.Builder
		sels   []selector
		blocks []ipBlock
	)
	for _, peer := range list {
		if peer.IPBlock != nil {
			b, err := r.ipBlock(peer.IPBlock)
			if err != nil {
				r.errs = append(r.errs, fmt.Errorf("networkpolicy %s/%s: %w: the peer matches nothing", np.Namespace, np.Name, err))
				continue
			}
			if !b.cidr.Addr().Is4() {
				continue
			}
			blocks = append(blocks, b)
			key.WriteString("block " + b.String() + "\x00")
			continue
		}
		s, err := r.newSelector(np.Namespace, peer)
		if err != nil {
			r.errs = append(r.errs, fmt.Errorf("networkpolicy %s/%s: %w: the peer matches nothing", np.Namespace, np.Name, err))
			continue
		}
		sels = append(sels, s)
		key.WriteString(s.key + "\x00")
	}
	if p, ok := r.peersMem[key.String()]; ok {
		return p
	}
	p := &peers{key: key.String(), blocks: blocks}
	r.peersMem[p.key] = p
	for _, b := range blocks {
		p.blockSets = append(p.blockSets, r.setID(blockSet(b)))
	}
	for _, s := range sels {
		p.selected = append(p.selected, r.selectPeers(s)...)
	}
	if len(p.selected) > 0 {
		p.selected = sortPods(p.selected)
		p.selectedSet = r.setID(podSet(p.selected))
	}
	return p
}

func (r *round) ipBlock(b *networkingv1.IPBlock) (ipBlock, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return ipBlock{}, fmt.Errorf("ipBlock: %w", err)
	}
	out := ipBlock{cidr: cidr.Masked()}
	if r.opts.IgnoreIPBlockExcept {
		return out, nil
	}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			return ipBlock{}, fmt.Errorf("ipBlock except: %w", err)
		}
		out.except = append(out.except, ex.Masked())
	}
	return out, nil
}

func (r *round) newSelector(ns string, peer networkingv1.NetworkPolicyPeer) (selector, error) {
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		return selector{}, errors.New("a peer with no selector and no ipBlock")
	}
	s := selector{pod: labels.Everything(), policy: ns}
	var err error
	if peer.PodSelector != nil {
		if s.pod, err = r.asSelector(peer.PodSelector); err != nil {
			return selector{}, fmt.Errorf("podSelector: %w", err)
		}
	}
	if peer.NamespaceSelector != nil {
		if s.ns, err = r.asSelector(peer.NamespaceSelector); err != nil {
			return selector{}, fmt.Errorf("namespaceSelector: %w", err)
		}
	}
	s.key = "pod " + s.pod.String() + "\x01"
	if s.ns == nil {
		s.key += "in " + ns
	} else {
		s.key += "ns " + s.ns.String()
	}
	return s, nil
}

// parsedSelector is a LabelSelector parsed.
type parsedSelector struct {
	sel labels.Selector
	err error
}

// asSelector parses a selector of a policy, or returns it as parsed in the last
// round: the objects of an informer's cache are never modified, only replaced, so
// an unchanged policy keeps its pointers.
func (r *round) asSelector(ls *metav1.LabelSelector) (labels.Selector, error) {
	if p, ok := r.parsed[ls]; ok {
		return p.sel, p.err
	}
	p, ok := r.c.parsed[ls]
	if !ok {
		p.sel, p.err = metav1.LabelSelectorAsSelector(ls)
	}
	r.parsed[ls] = p
	return p.sel, p.err
}

// selectPeers returns the pods s selects.
func (r *round) selectPeers(s selector) []*pod {
	if pods, ok := r.selMem[s.key]; ok {
		return pods
	}
	var pods []*pod
	match := func(candidates []*pod) {
		for _, pp := range candidates {
			if s.pod.Matches(pp.labels) {
				pods = append(pods, pp)
			}
		}
	}
	if s.ns == nil {
		match(r.byNS[s.policy])
	} else {
		for name, candidates := range r.byNS {
			if s.ns.Matches(r.ns[name]) {
				match(candidates)
			}
		}
	}
	r.selMem[s.key] = pods
	return pods
}

// port is a numeric port range of a protocol; 0, 0 is any port.
type port struct {
	proto    bpf.Proto
	min, max uint16
}

// protocol returns the datapath's number for a rule port's protocol (TCP if unset).
func protocol(p *corev1.Protocol) bpf.Proto {
	if p == nil {
		return bpf.TCP
	}
	switch *p {
	case corev1.ProtocolUDP:
		return bpf.UDP
	case corev1.ProtocolSCTP:
		return bpf.SCTP
	}
	return bpf.TCP
}

// numericPort returns the range a rule port gives by number, or ok false for a port
// given by name.
func numericPort(np networkingv1.NetworkPolicyPort) (p port, ok bool) {
	p.proto = protocol(np.Protocol)
	if np.Port == nil {
		return p, true
	}
	if np.Port.Type == intstr.String {
		return p, false
	}
	p.min, p.max = uint16(np.Port.IntVal), uint16(np.Port.IntVal)
	if np.EndPort != nil && *np.EndPort > np.Port.IntVal {
		p.max = uint16(*np.EndPort)
	}
	return p, true
}

// resolve returns the port a pod declares under name for proto.
func resolve(pp *pod, name string, proto bpf.Proto) (uint16, bool) {
	for _, cp := range pp.ports {
		if cp.Name == name && protocol(&cp.Protocol) == proto {
			return uint16(cp.ContainerPort), true
		}
	}
	return 0, false
}

// ingressRules is an ingress rule for the endpoint of pod pp, its named ports resolved
// against pp's containers.
func (r *round) ingressRules(t ingressRule, pp *pod) []bpf.PolicyRule {
	if len(t.ports) == 0 {
		return cross(t.sets, []port{{}})
	}
	var ports []port
	for _, np := range t.ports {
		if p, ok := numericPort(np); ok {
			ports = append(ports, p)
			continue
		}
		if r.opts.NamedPortsUnresolved {
			continue
		}
		if n, ok := resolve(pp, np.Port.StrVal, protocol(np.Protocol)); ok {
			ports = append(ports, port{proto: protocol(np.Protocol), min: n, max: n})
		}
	}
	return cross(t.sets, ports)
}

func cross(sets []uint32, ports []port) []bpf.PolicyRule {
	out := make([]bpf.PolicyRule, 0, len(sets)*len(ports))
	for _, s := range sets {
		for _, p := range ports {
			out = append(out, bpf.PolicyRule{SetID: s, PortMin: p.min, PortMax: p.max, Proto: p.proto})
		}
	}
	return out
}

// egressRules compiles an egress rule. A named port resolves against each destination
// pod: one rule per distinct (port, protocol), whose set holds the pods that declare
// it among those the rule's peers match (every pod for any peer, the pods whose IP an
// ipBlock holds).
func (r *round) egressRules(np *networkingv1.NetworkPolicy, rule networkingv1.NetworkPolicyEgressRule) []bpf.PolicyRule {
	p := r.peerSets(np, rule.To)
	sets := p.ids()
	if len(rule.Ports) == 0 || r.opts.EgressIgnoresPorts {
		return cross(sets, []port{{}})
	}
	var ports []port
	var out []bpf.PolicyRule
	for _, pt := range rule.Ports {
		if n, ok := numericPort(pt); ok {
			ports = append(ports, n)
			continue
		}
		if r.opts.NamedPortsUnresolved {
			continue
		}
		out = append(out, r.namedEgress(p, pt.Port.StrVal, protocol(pt.Protocol))...)
	}
	return append(out, cross(sets, ports)...)
}

// namedEgress returns the rules of a named port to peers p: one per distinct port
// the destination pods declare under that name.
func (r *round) namedEgress(p *peers, name string, proto bpf.Proto) []bpf.PolicyRule {
	memo := p.key + "\x02" + name + "/" + proto.String()
	if rules, ok := r.namedMem[memo]; ok {
		return rules
	}
	byPort := map[uint16][]*pod{}
	for _, pp := range r.destinations(p) {
		if n, ok := resolve(pp, name, proto); ok {
			byPort[n] = append(byPort[n], pp)
		}
	}
	var rules []bpf.PolicyRule
	for n, pods := range byPort {
		rules = append(rules, bpf.PolicyRule{SetID: r.setID(podSet(sortPods(pods))), PortMin: n, PortMax: n, Proto: proto})
	}
	r.namedMem[memo] = rules
	return rules
}

// destinations returns the pods a rule's peers match, each once.
func (r *round) destinations(p *peers) []*pod {
	if p.any {
		return r.peers
	}
	out := slices.Clone(p.selected)
	if len(p.blocks) == 0 {
		return out
	}
	seen := make(map[*pod]bool, len(out))
	for _, pp := range out {
		seen[pp] = true
	}
	for _, pp := range r.peers {
		if seen[pp] {
			continue
		}
		for _, b := range p.blocks {
			if b.contains(pp.ip) {
				seen[pp] = true
				out = append(out, pp)
				break
			}
		}
	}
	return out
}

// sortPods orders pods by IP and drops duplicates, in place.
func sortPods(pods []*pod) []*pod {
	slices.SortFunc(pods, func(a, b *pod) int { return cmp.Compare(a.idx, b.idx) })
	return slices.Compact(pods)
}

// podSet is the set of the pods' IPs; pods must be sorted (sortPods), and the set is
// canonical.
func podSet(pods []*pod) Set {
	s := make(Set, 0, len(pods))
	for _, pp := range pods {
		s = append(s, Entry{Prefix: netip.PrefixFrom(pp.ip, 32)})
	}
	return s
}

// blockSet is an ipBlock's set: its cidr, and its except prefixes carved out.
func blockSet(b ipBlock) Set {
	s := Set{{Prefix: b.cidr}}
	for _, e := range b.except {
		s = append(s, Entry{Prefix: e, Except: true})
	}
	return s
}

// canonical orders s by prefix and keeps each prefix once, an except entry over a
// member of the same prefix (it carves the prefix out).
func canonical(s Set) Set {
	order := func(a, b Entry) int {
		return cmp.Or(a.Prefix.Addr().Compare(b.Prefix.Addr()), cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits()), compareBool(b.Except, a.Except))
	}
	if !slices.IsSortedFunc(s, order) {
		slices.SortFunc(s, order)
	}
	return slices.CompactFunc(s, func(a, b Entry) bool { return a.Prefix == b.Prefix })
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// key is a canonical set's content as a map key.
func key(s Set) string {
	var b strings.Builder
	b.Grow(len(s) * 6)
	for _, e := range s {
		a := e.Prefix.Addr().As4()
		b.Write(a[:])
		flag := byte(e.Prefix.Bits())
		if e.Except {
			flag |= 0x80
		}
		b.WriteByte(flag)
	}
	return b.String()
}

// setID returns the ID of the set with s's content: this round's, else the last
// round's, else a new one.
func (r *round) setID(s Set) uint32 {
	s = canonical(s)
	k := key(s)
	if id, ok := r.ids[k]; ok {
		return id
	}
	id, ok := r.c.ids[k]
	if !ok {
		r.c.last++
		id = r.c.last
	}
	r.ids[k] = id
	r.sets[id] = s
	return id
}
