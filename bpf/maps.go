package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Map is a typed view of one of the datapath's maps: K and V are the Go
// mirrors of the map's C key and value.
type Map[K comparable, V any] struct {
	name string
	m    *ebpf.Map
}

func newMap[K comparable, V any](name string, m *ebpf.Map) *Map[K, V] {
	return &Map[K, V]{name: name, m: m}
}

// Name is the map's name, which is also its pin name.
func (m *Map[K, V]) Name() string { return m.name }

// Raw returns the underlying map, e.g. for batch operations. It is closed
// by Datapath.Close.
func (m *Map[K, V]) Raw() *ebpf.Map { return m.m }

// Lookup returns the value stored under k. The error wraps
// ebpf.ErrKeyNotExist when there is none.
func (m *Map[K, V]) Lookup(k K) (V, error) {
	var v V
	if err := m.m.Lookup(k, &v); err != nil {
		return v, fmt.Errorf("lookup %v in %s: %w", k, m.name, err)
	}
	return v, nil
}

// Put creates or replaces the entry for k.
func (m *Map[K, V]) Put(k K, v V) error {
	if err := m.m.Update(k, v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("put %v in %s: %w", k, m.name, err)
	}
	return nil
}

// Delete removes the entry for k. Deleting a missing key is not an error.
func (m *Map[K, V]) Delete(k K) error {
	if err := m.m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete %v from %s: %w", k, m.name, err)
	}
	return nil
}

// Iterate calls fn for each entry until fn returns false. Entries that are
// added or deleted meanwhile may or may not be seen.
func (m *Map[K, V]) Iterate(fn func(K, V) bool) error {
	var (
		k K
		v V
	)
	it := m.m.Iterate()
	for it.Next(&k, &v) {
		if !fn(k, v) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", m.name, err)
	}
	return nil
}

// All returns a snapshot of the map's entries.
func (m *Map[K, V]) All() (map[K]V, error) {
	all := make(map[K]V)
	err := m.Iterate(func(k K, v V) bool {
		all[k] = v
		return true
	})
	return all, err
}
