package cachingmap

import (
	"errors"
	"maps"
	"testing"
)

type fakeBackend struct {
	m       map[string]int
	puts    int
	deletes int
	failPut string
}

func (f *fakeBackend) Put(k string, v int) error {
	if k == f.failPut {
		return errors.New("map full")
	}
	f.puts++
	f.m[k] = v
	return nil
}
func (f *fakeBackend) Delete(k string) error        { f.deletes++; delete(f.m, k); return nil }
func (f *fakeBackend) All() (map[string]int, error) { return maps.Clone(f.m), nil }

func TestAdoptsAndWritesOnlyDifferences(t *testing.T) {
	kernel := &fakeBackend{m: map[string]int{"keep": 1, "change": 2, "stale": 3}}
	m := New[string, int]("test", kernel)
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	m.SetDesired(map[string]int{"keep": 1, "change": 20, "new": 4})
	n, err := m.ApplyUpdates()
	if err != nil || n != 2 || kernel.puts != 2 {
		t.Fatalf("ApplyUpdates wrote %d (puts %d), err %v; want the 2 entries that differ", n, kernel.puts, err)
	}
	if _, ok := kernel.m["stale"]; !ok {
		t.Fatal("ApplyUpdates deleted an entry; deletions must wait for ApplyDeletions")
	}
	if n, err := m.ApplyDeletions(); err != nil || n != 1 {
		t.Fatalf("ApplyDeletions deleted %d, err %v; want 1", n, err)
	}
	if !maps.Equal(kernel.m, map[string]int{"keep": 1, "change": 20, "new": 4}) {
		t.Fatalf("kernel holds %v", kernel.m)
	}
	if n, _ := m.ApplyUpdates(); n != 0 {
		t.Fatalf("a second apply wrote %d entries; want none", n)
	}
}

func TestFailedPutIsRetried(t *testing.T) {
	kernel := &fakeBackend{m: map[string]int{}, failPut: "a"}
	m := New[string, int]("test", kernel)
	m.SetDesired(map[string]int{"a": 1})
	if _, err := m.ApplyUpdates(); err == nil {
		t.Fatal("want the backend's error")
	}
	kernel.failPut = ""
	if n, err := m.ApplyUpdates(); err != nil || n != 1 {
		t.Fatalf("retry wrote %d, err %v", n, err)
	}
}

func TestFlush(t *testing.T) {
	kernel := &fakeBackend{m: map[string]int{"a": 1, "b": 2}}
	m := New[string, int]("test", kernel)
	if err := m.Flush(); err != nil || len(kernel.m) != 0 {
		t.Fatalf("Flush left %v, err %v", kernel.m, err)
	}
}
