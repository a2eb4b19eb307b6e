package driver

import (
	"context"
	"slices"
	"testing"
)

func TestOffers(t *testing.T) {
	info := Info{Name: "refdp", Modes: []string{"ebpf"}, Versions: []string{"v1"}, Settings: []string{"mtu"}}
	tests := []struct {
		name string
		info Info
		opts StartOptions
		want string // "" means offered
	}{
		{"the default is always offered", Info{Name: "refdp"}, StartOptions{}, ""},
		{"all offered", info, StartOptions{Mode: "ebpf", Version: "v1", Set: map[string]string{"mtu": "1400"}}, ""},
		{"a version not offered", info, StartOptions{Version: "v2"}, `refdp does not offer version "v2" (versions: v1)`},
		{"a mode when none is offered", Info{Name: "refdp"}, StartOptions{Mode: "iptables"}, `refdp does not offer mode "iptables" (it offers no modes)`},
		{"the latest of one version", info, StartOptions{Version: VersionLatest}, ""},
		{"the previous of one version", info, StartOptions{Version: VersionPrevious}, "refdp offers one version (v1): @previous needs 2 (info's versions, oldest first)"},
		{"the previous of none", Info{Name: "refdp"}, StartOptions{Version: VersionPrevious}, "refdp offers no versions: @previous needs 2 (info's versions, oldest first)"},
		{"every problem is named", info, StartOptions{Mode: "xdp", Set: map[string]string{"b": "1", "a": "2", "mtu": "1"}},
			"refdp does not offer mode \"xdp\" (modes: ebpf)\n" +
				"refdp does not offer setting \"a\" (settings: mtu)\n" +
				"refdp does not offer setting \"b\" (settings: mtu)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.info.Offers(tt.opts)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Offers(%+v) = %q, want %q", tt.opts, got, tt.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	info := Info{Name: "refdp", Versions: []string{"v1", "v2", "v3"}}
	for _, tt := range []struct{ version, want string }{
		{"", ""}, {"v1", "v1"}, {VersionLatest, "v3"}, {VersionPrevious, "v2"},
	} {
		got, err := info.Resolve(StartOptions{Version: tt.version, Set: map[string]string{"k": "v"}})
		if err != nil || got.Version != tt.want || got.Set["k"] != "v" {
			t.Errorf("Resolve(%q) = %+v, %v; want version %q, the rest as it was", tt.version, got, err, tt.want)
		}
	}
	if got := (StartOptions{Version: "v2", Set: map[string]string{"ct-size": "8"}}).String(); got != "start --version v2 --set ct-size=8" {
		t.Errorf("String() = %q", got)
	}
}

func TestStartOptionsArgs(t *testing.T) {
	if args := (StartOptions{}).Args(); len(args) != 0 {
		t.Errorf("the default start has flags %q; a driver that knows none must still start", args)
	}
	got := StartOptions{Mode: "m", Version: "v", Set: map[string]string{"z": "1", "a": "x=y"}}.Args()
	want := []string{"--mode", "m", "--version", "v", "--set", "a=x=y", "--set", "z=1"}
	if !slices.Equal(got, want) {
		t.Errorf("Args() = %q, want %q", got, want)
	}
	// What the driver executable receives.
	d, err := NewExec(fakeDriver(t, `[ "$*" = "start --mode m --version v --set a=x=y --set z=1" ] && echo '{"pid":1}' || { echo "$*" >&2; exit 1; }`), DefaultTimeouts)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background(), Node{Name: "n"}, StartOptions{Mode: "m", Version: "v", Set: map[string]string{"z": "1", "a": "x=y"}}); err != nil {
		t.Fatal(err)
	}
}
