package bpf

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
)

// Map is a typed view of one of the datapath's maps: K and V are the Go
// mirrors of the map's C key and value.
type Map[K comparable, V any] struct {
	name string
	m    *ebpf.Map
	// encode, if set, gives a value the encoding the map's format needs (the
	// conntrack map's values come in two formats); else V encodes itself.
	encode func(V) any
}

func newMap[K comparable, V any](name string, m *ebpf.Map) *Map[K, V] {
	return &Map[K, V]{name: name, m: m}
}

// value is v as the map stores it.
func (m *Map[K, V]) value(v V) any {
	if m.encode != nil {
		return m.encode(v)
	}
	return v
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
	if err := m.m.Update(k, m.value(v), ebpf.UpdateAny); err != nil {
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

// All returns every entry of the map. It reads in batches where the kernel and the
// key and value types allow (one syscall per few thousand entries: adopting a large
// pinned map on restart is then a matter of milliseconds), and falls back to
// iterating one entry at a time.
func (m *Map[K, V]) All() (map[K]V, error) {
	if all, err := m.batchAll(); err == nil {
		return all, nil
	}
	all := make(map[K]V)
	err := m.Iterate(func(k K, v V) bool {
		all[k] = v
		return true
	})
	return all, err
}

// batchChunk is how many entries one batch lookup asks for.
const batchChunk = 4096

var byteType = reflect.TypeOf(byte(0))

// batchAll reads the map with BPF_MAP_LOOKUP_BATCH into raw [size]byte slices and
// decodes each entry with the types' UnmarshalBinary.
func (m *Map[K, V]) batchAll() (map[K]V, error) {
	var k K
	var v V
	if _, ok := any(&k).(encoding.BinaryUnmarshaler); !ok {
		return nil, errNoBatch
	}
	if _, ok := any(&v).(encoding.BinaryUnmarshaler); !ok {
		return nil, errNoBatch
	}
	keys := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(m.m.KeySize()), byteType)), batchChunk, batchChunk)
	vals := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(m.m.ValueSize()), byteType)), batchChunk, batchChunk)
	all := make(map[K]V)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.m.BatchLookup(&cursor, keys.Interface(), vals.Interface(), nil)
		for i := 0; i < n; i++ {
			var k K
			var v V
			if uerr := any(&k).(encoding.BinaryUnmarshaler).UnmarshalBinary(keys.Index(i).Bytes()); uerr != nil {
				return nil, fmt.Errorf("batch read %s: %w", m.name, uerr)
			}
			if uerr := any(&v).(encoding.BinaryUnmarshaler).UnmarshalBinary(vals.Index(i).Bytes()); uerr != nil {
				return nil, fmt.Errorf("batch read %s: %w", m.name, uerr)
			}
			all[k] = v
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return all, nil
		}
		if err != nil {
			return nil, fmt.Errorf("batch read %s: %w", m.name, err)
		}
	}
}

var errNoBatch = errors.New("types without UnmarshalBinary cannot be read in batches")
