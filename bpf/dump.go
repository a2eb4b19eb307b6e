package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
)

// Dump reads the maps pinned in pinDir, without loading programs or changing
// anything (Open would set aside a conntrack map of another size than its
// options'), and renders each entry as text: map name -> key -> value. Every
// conntrack map pinned is read, of either format. A map that is not pinned is
// left out; one that cannot be read is rendered as its error under the key
// "error". It is what `refdp dump` prints, for a person.
func Dump(pinDir string) (map[string]map[string]string, error) {
	if err := checkPinDir(pinDir); err != nil {
		return nil, err
	}
	out := map[string]map[string]string{}
	read := func(name string, all func(*ebpf.Map) (map[string]string, error)) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			return
		}
		if err == nil {
			defer m.Close()
			var entries map[string]string
			if entries, err = all(m); err == nil {
				out[name] = entries
				return
			}
		}
		out[name] = map[string]string{"error": err.Error()}
	}
	read(FrontendsMapName, text[FrontendKey, FrontendValue])
	read(BackendsMapName, text[BackendKey, BackendValue])
	read(EndpointsMapName, text[uint32, EndpointValue])
	read(IPSetsMapName, text[IPSetKey, IPSetValue])
	read(PolicyMapName, text[PolicyKey, PolicyRule])
	read(ConfigMapName, text[uint32, Config])
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return out, fmt.Errorf("list %s: %w", pinDir, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ConntrackMapName) {
			read(e.Name(), text[ConntrackKey, ConntrackValue])
		}
	}
	return out, nil
}

// text reads every entry of m as K and V and renders them.
func text[K comparable, V any](m *ebpf.Map) (map[string]string, error) {
	all, err := newMap[K, V](m.String(), m).All()
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(all))
	for k, v := range all {
		out[fmt.Sprint(k)] = fmt.Sprintf("%+v", v)
	}
	return out, nil
}
