package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/proc"
	"github.com/dpconform/dpconform/driver/skel"
)

// pinDir is where refdp pins its maps in the node's bpffs, as `refdp run
// --bpffs` does (reference/cmd/refdp).
func (e env) pinDir() string { return filepath.Join(e.bpffs, "refdp") }

// verdictCursor is what `events` has seen of the node's ring buffer of
// verdicts, written "<ring>/<read>/<lost>": the ring buffer's map ID (0: none
// was pinned), the verdicts returned so far and the ring's lost count when it
// was last drained. The ring buffer keeps its own read position, so the
// cursor does not say where to read from: it says what a loss is.
type verdictCursor struct {
	ring       ebpf.MapID
	read, lost uint64
}

func (c verdictCursor) String() string { return fmt.Sprintf("%d/%d/%d", c.ring, c.read, c.lost) }

func parseCursor(s string) (verdictCursor, error) {
	var (
		c  verdictCursor
		id uint64
	)
	f := strings.Split(s, "/")
	if len(f) != 3 {
		return c, fmt.Errorf("cursor %q: want <ring>/<read>/<lost>", s)
	}
	var err error
	if id, err = strconv.ParseUint(f[0], 10, 32); err == nil {
		if c.read, err = strconv.ParseUint(f[1], 10, 64); err == nil {
			c.lost, err = strconv.ParseUint(f[2], 10, 64)
		}
	}
	if err != nil {
		return c, fmt.Errorf("cursor %q: %w", s, err)
	}
	c.ring = ebpf.MapID(id)
	return c, nil
}

// events drains the node's pinned ring buffer of policy verdicts: it needs no
// agent, since the attached programs report while none runs. It fails,
// rather than return an incomplete log, when verdicts were lost since the
// cursor (the ring buffer was full, or was replaced). An empty cursor is a
// first call: what the ring buffer lost before is no one's loss.
func eventsIn(e env, cursor string) (driver.Events, error) {
	first := cursor == ""
	var cur verdictCursor
	if !first {
		var err error
		if cur, err = parseCursor(cursor); err != nil {
			return driver.Events{}, skel.Fail("bad cursor", "%w: pass the cursor the last events call returned, or none", err)
		}
	}
	unlock, err := e.lockVerdicts()
	if err != nil {
		return driver.Events{}, err
	}
	defer unlock()

	ring := filepath.Join(e.pinDir(), bpf.VerdictsMapName)
	r, err := bpf.OpenVerdicts(e.pinDir())
	if errors.Is(err, os.ErrNotExist) {
		if cur.ring != 0 {
			return driver.Events{}, skel.Fail("verdicts lost", "the ring buffer %s that cursor %s read is no longer pinned: the verdicts it held are lost", ring, cursor)
		}
		// No datapath on the node yet: nothing was reported.
		return driver.Events{Cursor: cur.String()}, nil
	}
	if err != nil {
		return driver.Events{}, skel.Fail("events failed", "%w", err)
	}
	defer r.Close()

	base := cur.lost
	switch {
	case first:
		if base, err = r.Lost(); err != nil {
			return driver.Events{}, skel.Fail("events failed", "%w", err)
		}
	case cur.ring == 0:
		base = 0 // pinned since the cursor: whatever it lost, it lost since
	case cur.ring != r.ID():
		return driver.Events{}, skel.Fail("verdicts lost", "%s is another ring buffer (map %d) than the one cursor %s read (map %d): the verdicts the old one held are lost", ring, r.ID(), cursor, cur.ring)
	}
	vs, err := r.Drain()
	if err != nil {
		return driver.Events{}, skel.Fail("events failed", "%w", err)
	}
	// Read after the drain: a verdict given before this call is either
	// drained by now or counted.
	lost, err := r.Lost()
	if err != nil {
		return driver.Events{}, skel.Fail("events failed", "%w", err)
	}
	switch {
	case lost > base:
		return driver.Events{}, skel.Fail("verdicts lost", "%d policy verdicts found the ring buffer %s full since cursor %q (%s went from %d to %d): the verdicts reported are incomplete",
			lost-base, ring, cursor, bpf.VerdictsLostMapName, base, lost)
	case lost < base:
		return driver.Events{}, skel.Fail("verdicts lost", "%s counts %d lost verdicts, fewer than the %d of cursor %q: it is not the counter the cursor read, and what the ring buffer lost meanwhile is unknown",
			bpf.VerdictsLostMapName, lost, base, cursor)
	}

	// The datapath stamps verdicts with the kernel's clock; the contract's time_ns
	// is the node's CLOCK_MONOTONIC as its processes read it, which a time namespace
	// (a node of the netns topology's clock skew) moves.
	offset, err := proc.MonotonicOffset()
	if err != nil {
		return driver.Events{}, skel.Fail("events failed", "this node's clock: %w", err)
	}
	out := driver.Events{
		Cursor: verdictCursor{ring: r.ID(), read: cur.read + uint64(len(vs)), lost: lost}.String(),
		Events: make([]driver.Event, len(vs)),
	}
	for i, v := range vs {
		out.Events[i] = driver.Event{
			TimeNS:  int64(v.TimeNs) + int64(offset),
			Verdict: v.Action.String(),
			Src:     v.Flow.Src.String(),
			Dst:     v.Flow.Dst.String(),
			Proto:   v.Flow.Proto.String(),
			Sport:   int(v.Flow.SrcPort),
			Dport:   int(v.Flow.DstPort),
			Reason:  fmt.Sprintf("%s policy of if%d: %s", v.Dir, v.Ifindex, v.Reason),
		}
	}
	return out, nil
}

// lockVerdicts serialises the events calls of a node: two readers draining
// the ring buffer at once would each return part of the verdicts. The lock
// is held for a drain, milliseconds; the verb's deadline bounds the wait.
func (e env) lockVerdicts() (unlock func(), err error) {
	p := filepath.Join(e.StateDir, "refdp-verdicts.lock")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, skel.Fail("events failed", "lock %s: %w", p, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, skel.Fail("events failed", "lock %s: %w", p, err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}
