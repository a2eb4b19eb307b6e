package bpf

//go:generate go tool bpf2go -cc clang -target bpfel -no-global-types datapathV1 datapath.c -- -DDPC_CT_FORMAT=1 -Wall -Werror -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
//go:generate go tool bpf2go -cc clang -target bpfel -no-global-types datapathV2 datapath.c -- -DDPC_CT_FORMAT=2 -Wall -Werror -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Names of the datapath's maps, which are also their pin names in the pin
// directory.
const (
	FrontendsMapName = "dpc_frontends"
	BackendsMapName  = "dpc_backends"
	ConntrackMapName = "dpc_conntrack"
	EndpointsMapName = "dpc_endpoints"
	IPSetsMapName    = "dpc_ipsets"
	PolicyMapName    = "dpc_policy"
	ConfigMapName    = "dpc_config"
	// LinksDirName is the subdirectory of the pin directory that holds the
	// pinned tcx links, one per interface and direction.
	LinksDirName = "links"
)

// pinNames are the names of every map the datapath may pin, conntrack maps of
// every format and those set aside included.
func pinNames() []string {
	names := []string{
		FrontendsMapName, BackendsMapName, EndpointsMapName,
		IPSetsMapName, PolicyMapName, ConfigMapName,
		VerdictsMapName, VerdictsLostMapName,
	}
	for _, f := range ConntrackFormats {
		names = append(names, f.PinName(), f.asidePinName())
	}
	return names
}

// DefaultConntrackSize is the conntrack capacity (entries; a flow takes two)
// when Options.ConntrackSize is 0: Linux's nf_conntrack_max on a machine of some
// GiB, half of Cilium's default for TCP. 65,536 filled within a fuzz round on two
// cores (a churn of NodePort connections and three policy writes' bursts of new UDP
// flows), and a full LRU map then evicts new flows' entries before their replies.
const DefaultConntrackSize = 262144

// Options tune Open.
type Options struct {
	// ConntrackSize is the capacity of the conntrack LRU map, in entries.
	// 0 means DefaultConntrackSize. If the pinned conntrack map has another
	// size, Open pins a new one and keeps the old one for MigrateConntrack.
	ConntrackSize uint32
	// ConntrackFormat is the format of the conntrack map's values: which of
	// refdp's versions the programs are (0: DefaultConntrackFormat). A map
	// pinned in the other format is kept for MigrateConntrack, as one of
	// another size is.
	ConntrackFormat ConntrackFormat
	// NoConntrackMigration is a fault switch ("no-ct-migration"), off by
	// default: a previous conntrack map (another size or format) is unpinned
	// and dropped, not migrated, so a resized or upgraded table starts empty.
	NoConntrackMigration bool
	// UnpinnedConntrack is a fault switch ("unpinned-conntrack"), off by
	// default: the conntrack map is neither adopted from nor pinned in the
	// pin directory, so conntrack state is lost on every Open.
	UnpinnedConntrack bool
	// SNATPortUnchecked is a fault switch ("snat-port-unchecked"), off by
	// default: a new NodePort flow that finds none of its SNAT port
	// candidates free takes over the first one without checking that the
	// flow holding it is over, so under port pressure it steals the port of
	// a live flow.
	SNATPortUnchecked bool
	// NoCTMirror is a fault switch ("no-ct-mirror"), off by default: while a
	// previous conntrack map is being migrated, the programs do not mirror
	// what they create into it, so a flow that a new program opens is unknown
	// to an old program still attached on another hook (see MigrateConntrack).
	NoCTMirror bool
	// ForceClsact attaches with clsact tc filters even where the kernel has
	// tcx links.
	ForceClsact bool
}

// AttachMode says how programs are attached to interfaces.
type AttachMode string

// Attach modes.
const (
	// AttachTCX uses tcx links (Linux 6.6+), pinned in the pin directory.
	AttachTCX AttachMode = "tcx"
	// AttachClsact uses direct-action bpf filters on a clsact qdisc, which
	// hold their program without a pin.
	AttachClsact AttachMode = "clsact"
)

// Datapath is the loaded reference datapath: its programs and its maps,
// adopted from the pin directory where a previous run left them.
type Datapath struct {
	pinDir string
	opts   Options
	mode   AttachMode
	// objs holds either version's programs and maps: the two objects have
	// the same ones, by the same names.
	objs datapathV2Objects
	// prevCT are the previous conntrack maps, newest first, until
	// MigrateConntrack has copied them (migrate.go).
	prevCT []previousConntrack

	frontends *Map[FrontendKey, FrontendValue]
	backends  *Map[BackendKey, BackendValue]
	conntrack *Map[ConntrackKey, ConntrackValue]
	endpoints *Map[uint32, EndpointValue]
	ipsets    *Map[IPSetKey, IPSetValue]
	policy    *Map[PolicyKey, PolicyRule]
	config    *Map[uint32, Config]

	// epMu serialises the writers of endpoint state, which read an
	// endpoint's value to write the next one (its policy slot flips).
	epMu sync.Mutex
}

// CheckKernel returns an error naming the first kernel feature that the
// datapath needs and the running kernel lacks.
func CheckKernel() error {
	if err := features.HaveProgramType(ebpf.SchedCLS); err != nil {
		return fmt.Errorf("kernel lacks BPF program type sched_cls (tc hooks): %w", err)
	}
	for _, mt := range []ebpf.MapType{ebpf.Hash, ebpf.LRUHash, ebpf.Array, ebpf.LPMTrie, ebpf.PerCPUArray, ebpf.RingBuf, ebpf.ArrayOfMaps} {
		if err := features.HaveMapType(mt); err != nil {
			return fmt.Errorf("kernel lacks BPF map type %s: %w", mt, err)
		}
	}
	for _, fn := range []asm.BuiltinFunc{
		asm.FnSkbLoadBytes, asm.FnSkbStoreBytes, asm.FnL3CsumReplace,
		asm.FnL4CsumReplace, asm.FnKtimeGetNs, asm.FnLoop, asm.FnRingbufReserve,
		asm.FnRingbufSubmit,
	} {
		if err := features.HaveProgramHelper(ebpf.SchedCLS, fn); err != nil {
			return fmt.Errorf("kernel lacks BPF helper %s for tc programs: %w", fn, err)
		}
	}
	return nil
}

var haveTCX = sync.OnceValue(func() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return fmt.Errorf("probe tcx: load program: %w", err)
	}
	defer prog.Close()
	// An interface index that cannot exist: a kernel with tcx says ENODEV,
	// and the link package reports ErrNotSupported for one without.
	l, err := link.AttachTCX(link.TCXOptions{Interface: int(^uint32(0)), Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close()
		return nil
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("kernel lacks tcx links (Linux 6.6+): %w", err)
	}
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	return fmt.Errorf("probe tcx: %w", err)
})

// HaveTCX returns nil if the kernel can attach tc programs with tcx links,
// else an error wrapping ebpf.ErrNotSupported.
func HaveTCX() error { return haveTCX() }

func checkPinDir(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("pin directory %s: %w", dir, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("pin directory %s is not on a bpf filesystem (mount -t bpf bpf DIR)", dir)
	}
	return nil
}

// Open loads the datapath's programs and maps, adopting the maps already
// pinned by name in pinDir (a directory on a bpffs) and pinning the others
// there, so that state survives the agent. Programs are attached only by
// the Attach methods. The conntrack map is adopted only if it has
// opts.ConntrackFormat and fits opts.ConntrackSize; otherwise a new one is
// pinned, and a previous one (another size, or the other format) is kept:
// the new programs look up what it holds until MigrateConntrack has copied
// it (conntrack.h, ct_lookup).
func Open(pinDir string, opts Options) (*Datapath, error) {
	if opts.ConntrackSize == 0 {
		opts.ConntrackSize = DefaultConntrackSize
	}
	if opts.ConntrackFormat == 0 {
		opts.ConntrackFormat = DefaultConntrackFormat
	}
	if _, err := opts.ConntrackFormat.layout(); err != nil {
		return nil, err
	}
	if err := CheckKernel(); err != nil {
		return nil, err
	}
	if err := checkPinDir(pinDir); err != nil {
		return nil, err
	}
	// A no-op on kernels that account BPF memory to cgroups (5.11+).
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("raise memlock limit: %w", err)
	}

	d := &Datapath{pinDir: pinDir, opts: opts, mode: AttachTCX}
	if opts.ForceClsact {
		d.mode = AttachClsact
	} else if err := HaveTCX(); err != nil {
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return nil, err
		}
		d.mode = AttachClsact
	}

	load := loadDatapathV2
	if opts.ConntrackFormat == ConntrackFormatV1 {
		load = loadDatapathV1
	}
	spec, err := load()
	if err != nil {
		return nil, fmt.Errorf("load datapath spec: %w", err)
	}
	if opts.SNATPortUnchecked {
		if err := spec.Variables[datapathV2VarDpcFaultSnatPortUnchecked].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set the fault snat-port-unchecked: %w", err)
		}
	}

	if opts.NoCTMirror {
		if err := spec.Variables[datapathV2VarDpcFaultNoCtMirror].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set the fault no-ct-mirror: %w", err)
		}
	}

	ctSpec := spec.Maps[ConntrackMapName]
	ctSpec.Name = opts.ConntrackFormat.PinName()
	ctSpec.MaxEntries = opts.ConntrackSize
	if opts.UnpinnedConntrack {
		ctSpec.Pinning = ebpf.PinNone
	} else {
		if d.prevCT, err = previousConntracks(pinDir, ctSpec, opts.ConntrackFormat); err != nil {
			return nil, err
		}
		if opts.NoConntrackMigration {
			if err := d.dropPrevious(); err != nil {
				return nil, err
			}
		}
	}

	oldEP, err := unpinIncompatible(pinDir, spec.Maps[EndpointsMapName])
	if err != nil {
		d.closePrev()
		return nil, err
	}
	if oldEP != nil {
		defer oldEP.Close()
	}

	err = spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}})
	if err != nil {
		d.closePrev()
		if oldEP != nil {
			// Put it back for the next try; the programs still use it.
			_ = oldEP.Pin(filepath.Join(pinDir, EndpointsMapName))
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("load datapath: a map pinned in %s has another layout (remove it with bpf.Remove): %w", pinDir, err)
		}
		return nil, fmt.Errorf("load datapath: %w", err)
	}

	d.frontends = newMap[FrontendKey, FrontendValue](FrontendsMapName, d.objs.DpcFrontends)
	d.backends = newMap[BackendKey, BackendValue](BackendsMapName, d.objs.DpcBackends)
	d.conntrack = newMap[ConntrackKey, ConntrackValue](ctSpec.Name, d.objs.DpcConntrack)
	d.conntrack.encode = func(v ConntrackValue) any { return formatted{v, opts.ConntrackFormat} }
	d.endpoints = newMap[uint32, EndpointValue](EndpointsMapName, d.objs.DpcEndpoints)
	d.ipsets = newMap[IPSetKey, IPSetValue](IPSetsMapName, d.objs.DpcIpsets)
	d.policy = newMap[PolicyKey, PolicyRule](PolicyMapName, d.objs.DpcPolicy)
	d.config = newMap[uint32, Config](ConfigMapName, d.objs.DpcConfig)
	if err := d.bindPrevious(); err != nil {
		d.Close()
		return nil, err
	}
	if oldEP != nil {
		if err := d.adoptEndpoints(oldEP); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

// unpinIncompatible unpins the map pinned under spec's name in pinDir if it
// does not fit spec (e.g. the smaller endpoint map of a version before
// network policy), so that the loader pins a new one, and returns it for its
// entries to be carried over. The programs attached meanwhile keep using it
// until they are replaced.
func unpinIncompatible(pinDir string, spec *ebpf.MapSpec) (*ebpf.Map, error) {
	pin := filepath.Join(pinDir, spec.Name)
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load pinned %s: %w", pin, err)
	}
	if spec.Compatible(m) == nil {
		m.Close()
		return nil, nil
	}
	if err := os.Remove(pin); err != nil {
		m.Close()
		return nil, fmt.Errorf("unpin %s, which does not fit this version (run `refdp cleanup`): %w", pin, err)
	}
	return m, nil
}

// adoptEndpoints copies each endpoint's pod IP and flags (the head of struct
// endpoint_value in every version) from an endpoint map of another layout.
// The endpoints have no policy until it is set again: the agent attaches
// every endpoint, with its policy, when it starts.
func (d *Datapath) adoptEndpoints(old *ebpf.Map) error {
	if old.KeySize() != 4 || old.ValueSize() < endpointValueV0Size {
		return nil // nothing we can read
	}
	var (
		k uint32
		v = make([]byte, old.ValueSize())
	)
	it := old.Iterate()
	for it.Next(&k, &v) {
		ep := EndpointValue{PodIP: getAddr(v[0:4]), Flags: EndpointFlags(binary.NativeEndian.Uint32(v[4:8])) &^ policyFlags}
		if err := d.endpoints.Put(k, ep); err != nil {
			return fmt.Errorf("adopt endpoints of another layout: %w", err)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("adopt endpoints of another layout: %w", err)
	}
	return nil
}

// Close releases the datapath's file descriptors. Pinned maps and attached
// programs stay: traffic keeps flowing while no agent runs.
func (d *Datapath) Close() error {
	d.closePrev()
	if err := d.objs.Close(); err != nil {
		return fmt.Errorf("close datapath objects: %w", err)
	}
	return nil
}

// PinDir is the pin directory the datapath was opened with.
func (d *Datapath) PinDir() string { return d.pinDir }

// Mode is how the datapath attaches programs: tcx where the kernel has it
// (unless Options.ForceClsact), clsact otherwise.
func (d *Datapath) Mode() AttachMode { return d.mode }

// Frontends is the NAT frontend map.
func (d *Datapath) Frontends() *Map[FrontendKey, FrontendValue] { return d.frontends }

// Backends is the NAT backend map.
func (d *Datapath) Backends() *Map[BackendKey, BackendValue] { return d.backends }

// Conntrack is the conntrack map (an LRU hash, two entries per flow).
func (d *Datapath) Conntrack() *Map[ConntrackKey, ConntrackValue] { return d.conntrack }

// Endpoints is the endpoint state map, keyed by the ifindex of a workload's
// host-side interface.
func (d *Datapath) Endpoints() *Map[uint32, EndpointValue] { return d.endpoints }

// IPSets is the map of the IP sets that policy rules name: an LPM trie of
// (set ID, prefix), where an Except entry carves a longer prefix out of its
// set. Write a set's entries before the rules that name it.
func (d *Datapath) IPSets() *Map[IPSetKey, IPSetValue] { return d.ipsets }

// Policy is the map of the endpoints' policy rules. Write it through
// SetEndpointPolicy, which keeps each endpoint's update atomic.
func (d *Datapath) Policy() *Map[PolicyKey, PolicyRule] { return d.policy }

// SetConfig records the node's host IP and host interface index.
func (d *Datapath) SetConfig(hostIP netip.Addr, hostIfindex int) error {
	if err := d.config.Put(0, Config{HostIP: hostIP, HostIfindex: uint32(hostIfindex)}); err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	return nil
}

// Config returns what SetConfig recorded (zero values before it).
func (d *Datapath) Config() (Config, error) {
	return d.config.Lookup(0)
}
