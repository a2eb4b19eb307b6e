package services

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/cachingmap"
)

// Syncer writes a Desired state to the frontend and backend maps. A service port whose
// backends change gets a fresh service ID: its new backends are written first and its
// frontends are switched to them in one update each, so a new connection never sees
// a half-written backend set; the old set is deleted afterwards.
type Syncer struct {
	frontends *cachingmap.Map[bpf.FrontendKey, bpf.FrontendValue]
	backends  *cachingmap.Map[bpf.BackendKey, bpf.BackendValue]
	// inPlace is the fault rebuild-backends-in-place.
	inPlace bool
	// frontendsFirst is the fault frontends-before-backends.
	frontendsFirst bool
	raw            cachingmap.Backend[bpf.BackendKey, bpf.BackendValue]
}

// SyncerOptions configure a Syncer.
type SyncerOptions struct {
	// RebuildBackendsInPlace is the fault "rebuild-backends-in-place": a service whose
	// backends change keeps its service ID, and its backend slots are deleted and
	// rewritten under the frontends' feet.
	RebuildBackendsInPlace bool
	// FrontendsBeforeBackends is the fault "frontends-before-backends": an Apply writes
	// the frontends before the backends, so a changed service's frontends point at a
	// fresh service ID whose backend slots are not written yet, for as long as the
	// backend writes take.
	FrontendsBeforeBackends bool
}

// NewSyncer adopts what the maps hold.
func NewSyncer(fe cachingmap.Backend[bpf.FrontendKey, bpf.FrontendValue], be cachingmap.Backend[bpf.BackendKey, bpf.BackendValue], opts SyncerOptions) (*Syncer, error) {
	s := &Syncer{
		frontends:      cachingmap.New("frontends", fe),
		backends:       cachingmap.New("backends", be),
		inPlace:        opts.RebuildBackendsInPlace,
		frontendsFirst: opts.FrontendsBeforeBackends,
		raw:            be,
	}
	if err := s.frontends.Load(); err != nil {
		return nil, err
	}
	if err := s.backends.Load(); err != nil {
		return nil, err
	}
	return s, nil
}

// Flush empties both maps (the fault "flush-nat-on-start").
func (s *Syncer) Flush() error {
	return errors.Join(s.frontends.Flush(), s.backends.Flush())
}

// DropFrontends deletes the frontends for which drop returns true (the fault
// "drop-clusterip-frontends-on-start") and returns how many it deleted.
func (s *Syncer) DropFrontends(drop func(bpf.FrontendKey) bool) (int, error) {
	return s.frontends.DeleteIf(drop)
}

// Stats count what one Apply changed.
type Stats struct {
	FrontendsWritten, FrontendsDeleted, BackendsWritten, BackendsDeleted int
	// Rebuilt are the service IDs rebuilt in place (the fault only); their flows'
	// conntrack entries are stale.
	Rebuilt []uint32
	// StaleUDP are the backends that UDP frontends had before the Apply and no
	// longer have (the backend left the Service, or the frontend went): the
	// conntrack entries of flows DNATed from such a frontend to such a backend
	// still send them there, for as long as the client keeps its 5-tuple (UDP has
	// no handshake that would pick a backend again). The caller deletes them. They
	// are read from the maps as written, so an Apply that failed half-way names
	// what it did change.
	StaleUDP []bpf.DNATFlows
	// StaleTCP are the same for TCP frontends. Their flows need nothing while the
	// backend is still listed (terminating, it may serve them to their end), but one
	// whose pod went without closing its connections leaves their clients waiting
	// in silence: the caller flags them (Datapath.MarkDNATFlowsGone) once the
	// backend is not listed any more.
	StaleTCP []bpf.DNATFlows
	// Exposed is, under the fault frontends-before-backends, how long the frontends
	// written pointed at backend slots not written yet: from the first frontend
	// write to the last backend write.
	Exposed time.Duration
}

func (s Stats) String() string {
	out := fmt.Sprintf("frontends +%d -%d, backends +%d -%d, rebuilt %v, UDP backends gone %d, TCP backends gone %d",
		s.FrontendsWritten, s.FrontendsDeleted, s.BackendsWritten, s.BackendsDeleted, s.Rebuilt, len(s.StaleUDP), len(s.StaleTCP))
	if s.Exposed > 0 {
		out += fmt.Sprintf(", frontends ahead of their backends for %s", s.Exposed)
	}
	return out
}

// protoBackends returns the backends of every frontend of the maps for proto.
func protoBackends(fe map[bpf.FrontendKey]bpf.FrontendValue, be map[bpf.BackendKey]bpf.BackendValue, proto bpf.Proto) map[bpf.FrontendKey][]bpf.BackendValue {
	out := map[bpf.FrontendKey][]bpf.BackendValue{}
	for f, v := range fe {
		if f.Proto != proto {
			continue
		}
		var bs []bpf.BackendValue
		for i := uint32(0); i < v.BackendCount; i++ {
			if b, ok := be[bpf.BackendKey{ServiceID: v.ServiceID, Index: i}]; ok {
				bs = append(bs, b)
			}
		}
		out[f] = bs
	}
	return out
}

// staleBackends lists the backends of before that each frontend no longer has in
// after, sorted.
func staleBackends(before, after map[bpf.FrontendKey][]bpf.BackendValue) []bpf.DNATFlows {
	var out []bpf.DNATFlows
	for f, bs := range before {
		for _, b := range bs {
			if !slices.Contains(after[f], b) {
				out = append(out, bpf.DNATFlows{Frontend: f, Backend: b})
			}
		}
	}
	slices.SortFunc(out, func(a, b bpf.DNATFlows) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// Apply writes d. Deletions happen only when complete is true: the caller knows the
// whole desired state (datastore in sync and host IPs known). Until then, entries a
// previous run left stay, so traffic they serve is not cut.
func (s *Syncer) Apply(d Desired, complete bool) (Stats, error) {
	// Read the cached kernel state in place: a restart with 10,000 services must not
	// copy it to find out that nothing changed.
	var dpFE map[bpf.FrontendKey]bpf.FrontendValue
	var dpBE map[bpf.BackendKey]bpf.BackendValue
	s.frontends.View(func(m map[bpf.FrontendKey]bpf.FrontendValue) { dpFE = m })
	s.backends.View(func(m map[bpf.BackendKey]bpf.BackendValue) { dpBE = m })
	// What flows may be DNATed to now: the views change as the Apply writes.
	udpBefore, tcpBefore := protoBackends(dpFE, dpBE, bpf.UDP), protoBackends(dpFE, dpBE, bpf.TCP)
	used := map[uint32]bool{}
	for _, v := range dpFE {
		used[v.ServiceID] = true
	}
	for k := range dpBE {
		used[k.ServiceID] = true
	}
	assigned := map[uint32]bool{}
	nextID := uint32(1)
	fresh := func() uint32 {
		for used[nextID] || assigned[nextID] {
			nextID++
		}
		return nextID
	}
	sameBackends := func(id, count uint32, want []bpf.BackendValue) bool {
		if int(count) != len(want) {
			return false
		}
		for i, b := range want {
			if dpBE[bpf.BackendKey{ServiceID: id, Index: uint32(i)}] != b {
				return false
			}
		}
		return true
	}

	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	wantFE := map[bpf.FrontendKey]bpf.FrontendValue{}
	wantBE := map[bpf.BackendKey]bpf.BackendValue{}
	var rebuild []uint32
	for _, k := range keys {
		sp := d[k]
		id := uint32(0)
		var previous uint32
		for _, f := range sp.Frontends {
			cur, ok := dpFE[f]
			if !ok || assigned[cur.ServiceID] {
				continue
			}
			previous = cur.ServiceID
			if sameBackends(cur.ServiceID, cur.BackendCount, sp.Backends) {
				id = cur.ServiceID
				break
			}
		}
		if id == 0 {
			if s.inPlace && previous != 0 {
				id = previous
				rebuild = append(rebuild, id)
			} else {
				id = fresh()
			}
		}
		assigned[id] = true
		for i, b := range sp.Backends {
			wantBE[bpf.BackendKey{ServiceID: id, Index: uint32(i)}] = b
		}
		for _, f := range sp.Frontends {
			wantFE[f] = bpf.FrontendValue{ServiceID: id, BackendCount: uint32(len(sp.Backends))}
		}
	}

	st := Stats{Rebuilt: rebuild}
	var errs []error
	// The fault: empty the service's backend slots before rewriting them.
	for _, id := range rebuild {
		for k := range dpBE {
			if k.ServiceID == id {
				if err := s.raw.Delete(k); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if len(rebuild) > 0 {
		if err := s.backends.Load(); err != nil {
			errs = append(errs, err)
		}
		s.backends.View(func(m map[bpf.BackendKey]bpf.BackendValue) { dpBE = m })
	}
	if !complete {
		// Keep what the kernel holds and is not (yet) desired.
		for k, v := range dpBE {
			if _, ok := wantBE[k]; !ok && !assigned[k.ServiceID] {
				wantBE[k] = v
			}
		}
		for k, v := range dpFE {
			if _, ok := wantFE[k]; !ok {
				wantFE[k] = v
			}
		}
	}
	s.backends.TakeDesired(wantBE)
	s.frontends.TakeDesired(wantFE)
	var exposedFrom time.Time
	if s.frontendsFirst {
		exposedFrom = time.Now()
		n, err := s.frontends.ApplyUpdates()
		st.FrontendsWritten, errs = n, append(errs, err)
	}
	n, err := s.backends.ApplyUpdates()
	st.BackendsWritten, errs = n, append(errs, err)
	if s.frontendsFirst && st.FrontendsWritten > 0 && n > 0 {
		st.Exposed = time.Since(exposedFrom)
	}
	if err != nil {
		// Frontends must not point at backends that are not there.
		return s.stale(st, udpBefore, tcpBefore), errors.Join(errs...)
	}
	if !s.frontendsFirst {
		n, err = s.frontends.ApplyUpdates()
		st.FrontendsWritten, errs = n, append(errs, err)
	}
	if complete && err == nil {
		n, err = s.frontends.ApplyDeletions()
		st.FrontendsDeleted, errs = n, append(errs, err)
		if err == nil {
			n, err = s.backends.ApplyDeletions()
			st.BackendsDeleted, errs = n, append(errs, err)
		}
	}
	return s.stale(st, udpBefore, tcpBefore), errors.Join(errs...)
}

// stale sets st.StaleUDP and st.StaleTCP to the backends of before that the
// frontends no longer have, as far as the maps were written: every frontend written
// points at its new backends only, so a flow whose conntrack entries are deleted from
// now on picks one of those.
func (s *Syncer) stale(st Stats, udpBefore, tcpBefore map[bpf.FrontendKey][]bpf.BackendValue) Stats {
	var fe map[bpf.FrontendKey]bpf.FrontendValue
	var be map[bpf.BackendKey]bpf.BackendValue
	s.frontends.View(func(m map[bpf.FrontendKey]bpf.FrontendValue) { fe = m })
	s.backends.View(func(m map[bpf.BackendKey]bpf.BackendValue) { be = m })
	st.StaleUDP = staleBackends(udpBefore, protoBackends(fe, be, bpf.UDP))
	st.StaleTCP = staleBackends(tcpBefore, protoBackends(fe, be, bpf.TCP))
	return st
}

// TCPBackends returns the backends of every TCP frontend, as the maps hold them.
func (s *Syncer) TCPBackends() map[bpf.FrontendKey][]bpf.BackendValue {
	var fe map[bpf.FrontendKey]bpf.FrontendValue
	var be map[bpf.BackendKey]bpf.BackendValue
	s.frontends.View(func(m map[bpf.FrontendKey]bpf.FrontendValue) { fe = m })
	s.backends.View(func(m map[bpf.BackendKey]bpf.BackendValue) { be = m })
	return protoBackends(fe, be, bpf.TCP)
}

// Frontends returns what the frontend map holds, as far as the Syncer knows.
func (s *Syncer) Frontends() map[bpf.FrontendKey]bpf.FrontendValue { return s.frontends.Dataplane() }

// Backends returns what the backend map holds, as far as the Syncer knows.
func (s *Syncer) Backends() map[bpf.BackendKey]bpf.BackendValue { return s.backends.Dataplane() }
