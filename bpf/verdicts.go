package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// Names of the maps of policy verdicts, which are also their pin names.
const (
	// VerdictsMapName is the ring buffer of verdicts (struct verdict_event).
	VerdictsMapName = "dpc_verdicts"
	// VerdictsLostMapName counts, per CPU, the verdicts that found the ring
	// buffer full.
	VerdictsLostMapName = "dpc_verdicts_lost"
)

// VerdictReader drains the policy verdicts that the programs report into
// the ring buffer pinned in a pin directory. The ring buffer keeps its read
// position itself: what one reader has drained, no later reader sees again,
// in this process or another. Two readers must not drain the same ring
// buffer at once: each would get part of the verdicts.
type VerdictReader struct {
	ring, lost *ebpf.Map
	rd         *ringbuf.Reader
	id         ebpf.MapID
}

// OpenVerdicts opens the ring buffer of verdicts and its lost counter that
// the datapath pinned in pinDir. It needs no agent: the attached programs
// keep reporting into the pinned ring buffer while none runs. The error wraps
// os.ErrNotExist if they are not pinned there (no datapath was ever opened
// on pinDir, or it was removed).
func OpenVerdicts(pinDir string) (*VerdictReader, error) {
	ring, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, VerdictsMapName), nil)
	if err != nil {
		return nil, fmt.Errorf("open verdict ring buffer: %w", err)
	}
	lost, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, VerdictsLostMapName), nil)
	if err != nil {
		ring.Close()
		return nil, fmt.Errorf("open verdict lost counter: %w", err)
	}
	r := &VerdictReader{ring: ring, lost: lost}
	if err := r.init(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *VerdictReader) init() error {
	if t := r.ring.Type(); t != ebpf.RingBuf {
		return fmt.Errorf("%s is a %s map, not a ring buffer", VerdictsMapName, t)
	}
	if t := r.lost.Type(); t != ebpf.PerCPUArray || r.lost.ValueSize() != 8 {
		return fmt.Errorf("%s is a %s map of %d-byte values, not a per-CPU array of counters", VerdictsLostMapName, t, r.lost.ValueSize())
	}
	info, err := r.ring.Info()
	if err != nil {
		return fmt.Errorf("info of %s: %w", VerdictsMapName, err)
	}
	var ok bool
	if r.id, ok = info.ID(); !ok {
		return fmt.Errorf("info of %s: the kernel gives no map ID", VerdictsMapName)
	}
	if r.rd, err = ringbuf.NewReader(r.ring); err != nil {
		return fmt.Errorf("read %s: %w", VerdictsMapName, err)
	}
	// Read returns at once when the ring buffer is empty, never waits.
	r.rd.SetDeadline(time.Unix(1, 0))
	return nil
}

// ID identifies the ring buffer (its kernel map ID). A reader with another ID
// reads another ring buffer, whose lost count started afresh.
func (r *VerdictReader) ID() ebpf.MapID { return r.id }

// Lost returns how many verdicts the programs could not report because the
// ring buffer was full, since the counter was created with the ring buffer.
func (r *VerdictReader) Lost() (uint64, error) {
	var perCPU []uint64
	if err := r.lost.Lookup(uint32(0), &perCPU); err != nil {
		return 0, fmt.Errorf("read %s: %w", VerdictsLostMapName, err)
	}
	var n uint64
	for _, c := range perCPU {
		n += c
	}
	return n, nil
}

// Drain returns the verdicts in the ring buffer, oldest first, and consumes
// them; it does not wait for more. Every verdict given before the call is in
// what it returns or what an earlier Drain returned, unless Lost counts it.
func (r *VerdictReader) Drain() ([]Verdict, error) {
	var (
		vs  []Verdict
		rec ringbuf.Record
	)
	for {
		err := r.rd.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return vs, nil
		}
		if err != nil {
			return vs, fmt.Errorf("read %s: %w", VerdictsMapName, err)
		}
		var v Verdict
		if err := v.UnmarshalBinary(rec.RawSample); err != nil {
			return vs, fmt.Errorf("read %s: %w", VerdictsMapName, err)
		}
		vs = append(vs, v)
	}
}

// Close releases the reader's file descriptors and mappings.
func (r *VerdictReader) Close() error {
	var errs []error
	if r.rd != nil {
		errs = append(errs, r.rd.Close())
	}
	errs = append(errs, r.ring.Close(), r.lost.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close verdict reader: %w", err)
	}
	return nil
}
