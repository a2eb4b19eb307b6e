package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// A conntrack map is migrated when Open finds one pinned that the programs it
// loads cannot adopt: another size (a resize), or the other format (an upgrade
// from refdp v1 to v2, or a downgrade). The order that loses no flow:
//
//  1. Open pins a new map for the programs it loads, and puts the previous map
//     in the slot of its format (dpc_ct_prev_v1 or _v2);
//  2. the caller attaches the new programs to every hook (AttachHost,
//     ReattachEndpoints), one hook after the other;
//  3. MigrateConntrack copies every entry of the previous map that the new map
//     lacks, converted, in the kernel (dpc_ct_migrate, a chunk at a time),
//     then empties the slots and unpins the previous map.
//
// During step 2 a flow may cross hooks that run the old programs (which know
// only the previous map) and hooks that run the new ones. So while the slot is
// full the new programs work with both maps (conntrack.h): a lookup that misses
// the new map adopts the entry from the previous one, converted (ct_lookup),
// and what they create or change that another hook reads (a flow's NAT, its
// SNAT port, its admission by policy) they also write to the previous map, in
// its format (ct_mirror). Without the mirror, a SYN that a new program DNATs
// has its SYN-ACK leave unNATed through an old program (measured: 1 to 4
// connections lost in 2 to 3 of 10 upgrades of UPGRADE-NEW-FLOWS-IN-WINDOW);
// without the adoption, every flow not copied yet falls through while the
// copy runs. Copying before step 2 (the fault ct-copy-before-attach) loses
// what the old programs write after the copy: once the slot is empty, the new
// programs cannot see it.

// previousConntrack is a conntrack map pinned by an earlier run that the
// programs of this one do not use.
type previousConntrack struct {
	m      *ebpf.Map
	pin    string
	format ConntrackFormat
	id     ebpf.MapID
}

func (p previousConntrack) String() string {
	return fmt.Sprintf("%s (%s, %d entries)", filepath.Base(p.pin), p.format, p.m.MaxEntries())
}

// previousConntracks sets aside the conntrack map pinned for format if it does
// not fit spec (another size), renaming its pin, and returns every conntrack
// map pinned in pinDir but the one spec will adopt, newest first: the set-aside
// one, the other format's, and any an interrupted migration left.
func previousConntracks(pinDir string, spec *ebpf.MapSpec, format ConntrackFormat) ([]previousConntrack, error) {
	cur := filepath.Join(pinDir, format.PinName())
	m, err := ebpf.LoadPinnedMap(cur, nil)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("load pinned conntrack %s: %w", cur, err)
	default:
		incompatible := spec.Compatible(m)
		m.Close()
		if incompatible != nil {
			aside, err := freePin(pinDir, format.asidePinName())
			if err != nil {
				return nil, err
			}
			if err := os.Rename(cur, aside); err != nil {
				return nil, fmt.Errorf("set aside conntrack that does not fit (%v): %w", incompatible, err)
			}
		}
	}

	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return nil, fmt.Errorf("list pin directory %s: %w", pinDir, err)
	}
	var prev []previousConntrack
	closeAll := func() {
		for _, p := range prev {
			p.m.Close()
		}
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ConntrackMapName) || e.Name() == format.PinName() {
			continue
		}
		p, err := loadPrevious(filepath.Join(pinDir, e.Name()))
		if err != nil {
			closeAll()
			return nil, err
		}
		prev = append(prev, p)
	}
	slices.SortFunc(prev, func(a, b previousConntrack) int { return int(b.id) - int(a.id) })
	return prev, nil
}

// freePin returns the path of the first of name, name2, name3, ... that is not
// pinned in pinDir.
func freePin(pinDir, name string) (string, error) {
	for i := 1; i < 100; i++ {
		p := filepath.Join(pinDir, name)
		if i > 1 {
			p += fmt.Sprint(i)
		}
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			return p, nil
		}
	}
	return "", fmt.Errorf("no free pin for a previous conntrack map in %s: remove the old ones (refdp cleanup)", pinDir)
}

// loadPrevious loads a pinned conntrack map of either format.
func loadPrevious(pin string) (previousConntrack, error) {
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		return previousConntrack{}, fmt.Errorf("load previous conntrack %s: %w", pin, err)
	}
	format, ferr := conntrackFormatOfSize(int(m.ValueSize()))
	info, ierr := m.Info()
	if ferr != nil || ierr != nil || m.Type() != ebpf.LRUHash || m.KeySize() != conntrackKeySize {
		m.Close()
		return previousConntrack{}, fmt.Errorf("%s is not a conntrack map of a refdp version (%s, key %d bytes, value %d bytes): remove it (refdp cleanup)",
			pin, m.Type(), m.KeySize(), m.ValueSize())
	}
	id, _ := info.ID()
	return previousConntrack{m: m, pin: pin, format: format, id: id}, nil
}

// bindPrevious puts the newest previous map of each format in that format's
// slot, where the programs look up what the new map lacks.
func (d *Datapath) bindPrevious() error {
	for _, f := range ConntrackFormats {
		i := slices.IndexFunc(d.prevCT, func(p previousConntrack) bool { return p.format == f })
		if i < 0 {
			continue
		}
		if err := d.prevSlot(f).Put(uint32(0), d.prevCT[i].m); err != nil {
			return fmt.Errorf("give the programs the previous conntrack %s: %w", d.prevCT[i], err)
		}
	}
	return nil
}

func (d *Datapath) prevSlot(f ConntrackFormat) *ebpf.Map {
	if f == ConntrackFormatV1 {
		return d.objs.DpcCtPrevV1
	}
	return d.objs.DpcCtPrevV2
}

// dropPrevious unpins the previous maps without copying them (the fault
// no-ct-migration).
func (d *Datapath) dropPrevious() error {
	var errs []error
	for _, p := range d.prevCT {
		if err := os.Remove(p.pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin previous conntrack %s: %w", p.pin, err))
		}
	}
	d.closePrev()
	return errors.Join(errs...)
}

func (d *Datapath) closePrev() {
	for _, p := range d.prevCT {
		p.m.Close()
	}
	d.prevCT = nil
}

// PreviousConntracks names the conntrack maps pinned by earlier runs that
// MigrateConntrack has still to copy, newest first, e.g.
// "dpc_conntrack (v1, 65536 entries)".
func (d *Datapath) PreviousConntracks() []string {
	var out []string
	for _, p := range d.prevCT {
		out = append(out, p.String())
	}
	return out
}

// ConntrackFormat is the format of the conntrack map the programs use.
func (d *Datapath) ConntrackFormat() ConntrackFormat { return d.opts.ConntrackFormat }

// Migration is what MigrateConntrack did.
type Migration struct {
	// From names the previous maps, newest first (PreviousConntracks).
	From []string
	// Copied counts the entries copied into the new map; Present those it
	// had already: adopted by the programs since Open, or a new flow's.
	Copied, Present int
	// Duration is the time the copy took.
	Duration time.Duration
}

// MigrateConntrack copies the entries of the previous conntrack maps into the
// current one, converted to its format (the newest map's entry wins, and an
// entry the current map has already wins over both), then stops the programs
// looking in them and unpins them. Call it once every hook runs the programs
// of this Datapath (AttachHost, ReattachEndpoints): an old program still
// attached somewhere would go on writing a previous map, and what it writes
// after the copy would be lost. With no previous map it does nothing.
func (d *Datapath) MigrateConntrack() (Migration, error) {
	mig := Migration{From: d.PreviousConntracks()}
	if len(d.prevCT) == 0 {
		return mig, nil
	}
	start := time.Now()
	for _, p := range d.prevCT {
		m, err := d.copyPrevious(p)
		mig.Copied += int(m.Copied)
		mig.Present += int(m.Present)
		if err != nil {
			return mig, fmt.Errorf("migrate conntrack from %s: %w", p, err)
		}
	}
	mig.Duration = time.Since(start)
	// Only now: until the last entry is copied, a lookup may still need them.
	for _, f := range ConntrackFormats {
		if err := d.prevSlot(f).Delete(uint32(0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return mig, fmt.Errorf("migrate conntrack: empty the %s slot: %w", f, err)
		}
	}
	if err := d.dropPrevious(); err != nil {
		return mig, fmt.Errorf("migrate conntrack: %w", err)
	}
	return mig, nil
}

// ctMigration mirrors struct ct_migration: the counts of a run of
// dpc_ct_migrate.
type ctMigration struct {
	Copied, Present, Failed uint64
}

// migrateChunk mirrors DPC_CT_MIGRATE_CHUNK: the entries a run of
// dpc_ct_migrate copies. A run holds its CPU with bottom halves off, so a
// chunk is a couple of milliseconds of it.
const migrateChunk = 16384

// ctStagedSize is the size of struct ct_staged: a key and a value of either
// format, format 1's first.
const ctStagedSize = conntrackKeySize + 48

// copyPrevious copies every entry of p whose tuple the current map lacks,
// converted, a chunk at a time: it reads a chunk of p (a batch lookup),
// writes it into dpc_ct_staging (mapped into memory), and runs
// dpc_ct_migrate on it, which writes
// each entry with BPF_NOEXIST (conntrack.h). Entries written to p meanwhile
// (the new programs' mirror) are in the current map already.
func (d *Datapath) copyPrevious(p previousConntrack) (ctMigration, error) {
	var total ctMigration
	size := p.format.ValueSize()
	keys := make([][conntrackKeySize]byte, migrateChunk)
	vals, valBytes := byteRows(migrateChunk, size)
	staged := make([]byte, migrateChunk*ctStagedSize)
	mem, err := d.objs.DpcCtStaging.Memory()
	if err != nil {
		return total, fmt.Errorf("map dpc_ct_staging: %w", err)
	}
	var in skbCtx
	binary.NativeEndian.PutUint32(in[skbPriorityOff:], uint32(p.format))
	var cursor ebpf.MapBatchCursor
	for {
		n, lerr := p.m.BatchLookup(&cursor, keys, vals.Interface(), nil)
		if lerr != nil && !errors.Is(lerr, ebpf.ErrKeyNotExist) {
			return total, fmt.Errorf("read %s: %w", p, lerr)
		}
		if n > 0 {
			for i := 0; i < n; i++ {
				e := staged[i*ctStagedSize : (i+1)*ctStagedSize]
				copy(e[:conntrackKeySize], keys[i][:])
				copy(e[conntrackKeySize:], valBytes[i*size:(i+1)*size])
			}
			if _, err := mem.WriteAt(staged[:n*ctStagedSize], 0); err != nil {
				return total, fmt.Errorf("stage a chunk of %s: %w", p, err)
			}
			binary.NativeEndian.PutUint32(in[skbMarkOff:], uint32(n))
			ret, err := d.objs.DpcCtMigrate.Run(&ebpf.RunOptions{Data: make([]byte, 64), Context: in[:]})
			if err != nil {
				return total, fmt.Errorf("run dpc_ct_migrate: %w", err)
			}
			if ret != tcActOK {
				return total, fmt.Errorf("dpc_ct_migrate refused a chunk of %d entries of format %s", n, p.format)
			}
			var m ctMigration
			if err := d.objs.DpcCtMigration.Get(&m); err != nil {
				return total, fmt.Errorf("read the counts of dpc_ct_migrate: %w", err)
			}
			total.Copied += m.Copied
			total.Present += m.Present
			total.Failed += m.Failed
		}
		if errors.Is(lerr, ebpf.ErrKeyNotExist) {
			break
		}
	}
	if total.Failed > 0 {
		return total, fmt.Errorf("%d entries could not be written (%d copied)", total.Failed, total.Copied)
	}
	return total, nil
}

// byteRows makes a slice of n arrays of size bytes (the shape the batch
// operations want for values whose size is known only at run time) and the
// bytes it holds.
func byteRows(n, size int) (reflect.Value, []byte) {
	rows := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, byteType)), n, n)
	return rows, unsafe.Slice((*byte)(rows.UnsafePointer()), n*size)
}

// skbCtx is struct __sk_buff as BPF_PROG_RUN takes it: only mark and ifindex
// may be set among the fields before cb.
type skbCtx [192]byte

const (
	skbMarkOff     = 8
	skbPriorityOff = 32
	tcActOK        = 0
)

// formatted is a ConntrackValue encoded in a given format, for a map of it.
type formatted struct {
	v ConntrackValue
	f ConntrackFormat
}

func (f formatted) MarshalBinary() ([]byte, error) { return f.v.marshal(f.f) }

// ReattachEndpoints attaches this Datapath's endpoint programs to every
// endpoint of the endpoint map whose interface still exists, in place of the
// programs an earlier run attached, and leaves the endpoints' state and policy
// as they are: the programs of another version (or with another conntrack
// map) take over the endpoints before the agent knows its workloads. It
// returns how many it attached.
func (d *Datapath) ReattachEndpoints() (int, error) {
	var ifindexes []int
	if err := d.endpoints.Iterate(func(k uint32, _ EndpointValue) bool {
		ifindexes = append(ifindexes, int(k))
		return true
	}); err != nil {
		return 0, fmt.Errorf("reattach endpoints: %w", err)
	}
	n := 0
	var errs []error
	for _, ifindex := range ifindexes {
		if _, err := netlink.LinkByIndex(ifindex); err != nil {
			continue // gone with its pod: the agent forgets it
		}
		if err := d.attach(ifindex, tcIngress, d.objs.TcEpIngress, "dpc_ep_ingress"); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := d.attach(ifindex, tcEgress, d.objs.TcEpEgress, "dpc_ep_egress"); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
