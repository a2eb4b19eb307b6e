// Package cachingmap keeps a BPF map in step with a desired state, writing only what
// differs. It adopts what the kernel already holds (pinned state from a previous run of
// the agent) and separates updates from deletions, so that the agent can write new
// entries at once but delete nothing until it has a full view of the desired state.
package cachingmap

import (
	"errors"
	"fmt"
	"maps"
)

// Backend is the kernel side of a map (bpf.Map satisfies it).
type Backend[K comparable, V any] interface {
	Put(K, V) error
	Delete(K) error
	All() (map[K]V, error)
}

// Map is a desired state for a Backend and a cache of what the Backend holds.
type Map[K comparable, V comparable] struct {
	name    string
	backend Backend[K, V]
	desired map[K]V
	// dataplane is what the kernel holds, as far as this Map knows.
	dataplane map[K]V
}

// New returns a Map with an empty desired state. Call Load before applying.
func New[K comparable, V comparable](name string, backend Backend[K, V]) *Map[K, V] {
	return &Map[K, V]{name: name, backend: backend, desired: map[K]V{}, dataplane: map[K]V{}}
}

// Load reads what the kernel holds: entries a previous run left are adopted, and
// rewritten only if the desired state differs.
func (m *Map[K, V]) Load() error {
	all, err := m.backend.All()
	if err != nil {
		return fmt.Errorf("load %s: %w", m.name, err)
	}
	m.dataplane = all
	return nil
}

// Dataplane returns a copy of what the kernel holds, as far as the Map knows.
func (m *Map[K, V]) Dataplane() map[K]V { return maps.Clone(m.dataplane) }

// View calls fn with what the kernel holds, as far as the Map knows, without copying
// it; fn must not modify or keep the map.
func (m *Map[K, V]) View(fn func(dataplane map[K]V)) { fn(m.dataplane) }

// SetDesired replaces the whole desired state with a copy of d.
func (m *Map[K, V]) SetDesired(d map[K]V) { m.desired = maps.Clone(d) }

// TakeDesired replaces the whole desired state with d itself, which the caller must
// not use afterwards (no copy: for large states built only to be handed over).
func (m *Map[K, V]) TakeDesired(d map[K]V) { m.desired = d }

// ApplyUpdates writes every desired entry that the kernel lacks or holds differently,
// and returns how many it wrote.
func (m *Map[K, V]) ApplyUpdates() (int, error) {
	var errs []error
	n := 0
	for k, v := range m.desired {
		if cur, ok := m.dataplane[k]; ok && cur == v {
			continue
		}
		if err := m.backend.Put(k, v); err != nil {
			errs = append(errs, fmt.Errorf("%s: put %v: %w", m.name, k, err))
			continue
		}
		m.dataplane[k] = v
		n++
	}
	return n, errors.Join(errs...)
}

// ApplyDeletions deletes every kernel entry that is not desired, and returns how many
// it deleted. Call it only with a complete desired state.
func (m *Map[K, V]) ApplyDeletions() (int, error) {
	return m.DeleteIf(func(k K) bool {
		_, ok := m.desired[k]
		return !ok
	})
}

// Flush deletes every entry the kernel holds and clears the desired state.
func (m *Map[K, V]) Flush() error {
	m.desired = map[K]V{}
	if err := m.Load(); err != nil {
		return err
	}
	_, err := m.ApplyDeletions()
	return err
}

// DeleteIf deletes every kernel entry for which drop returns true, and returns how
// many it deleted.
func (m *Map[K, V]) DeleteIf(drop func(K) bool) (int, error) {
	var errs []error
	n := 0
	for k := range m.dataplane {
		if !drop(k) {
			continue
		}
		if err := m.backend.Delete(k); err != nil {
			errs = append(errs, fmt.Errorf("%s: delete %v: %w", m.name, k, err))
			continue
		}
		delete(m.dataplane, k)
		n++
	}
	return n, errors.Join(errs...)
}
