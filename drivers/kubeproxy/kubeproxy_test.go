package kubeproxy

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies/controlplane"
)

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		err  bool
	}{
		{"", IPTables, false},
		{"iptables", IPTables, false},
		{"nftables", NFTables, false},
		{"ipvs", "", true},
		{"IPTABLES", "", true},
	} {
		got, err := ParseMode(tc.in)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("ParseMode(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestRenderRefusesWhatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no node", Config{Kubeconfig: "/k"}, "no NodeName"},
		{"no kubeconfig", Config{NodeName: "node-a"}, "no Kubeconfig"},
		{"bad mode", Config{NodeName: "node-a", Kubeconfig: "/k", Mode: "ipvs"}, `unknown kube-proxy mode "ipvs"`},
		{"bad CIDR", Config{NodeName: "node-a", Kubeconfig: "/k", ClusterCIDR: "10.244.0.0"}, "ClusterCIDR"},
		{"bad healthz", Config{NodeName: "node-a", Kubeconfig: "/k", HealthzAddress: "0.0.0.0"}, "HealthzAddress"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.Render()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render() error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestRealKubeProxyReadsTheConfiguration has the real kube-proxy load the rendered file
// and write back the configuration it would run with (--write-config-to touches
// nothing else), to prove that every field means what the fixture says, and that none
// is misspelt (kube-proxy would fall back to lenient decoding and warn).
func TestRealKubeProxyReadsTheConfiguration(t *testing.T) {
	bins, _ := controlplane.FindBinaries()
	if err := bins.HasKubeProxy(); err != nil {
		if privileged.Required() {
			t.Fatal(err)
		}
		t.Skip("SKIPPED: ", err)
	}
	for _, mode := range Modes {
		t.Run(string(mode), func(t *testing.T) {
			dir := t.TempDir()
			data, err := Config{NodeName: "node-a", Kubeconfig: "/run/kubeconfig", Mode: mode}.Render()
			if err != nil {
				t.Fatal(err)
			}
			in, out := filepath.Join(dir, "in.conf"), filepath.Join(dir, "out.yaml")
			if err := os.WriteFile(in, data, 0o644); err != nil {
				t.Fatal(err)
			}
			log, err := exec.Command(bins.KubeProxy, "--config="+in, "--write-config-to="+out).CombinedOutput()
			if err != nil {
				t.Fatalf("kube-proxy --write-config-to: %v\n%s", err, log)
			}
			if strings.Contains(string(log), "lenient decoding") {
				t.Fatalf("kube-proxy did not decode the configuration strictly:\n%s", log)
			}
			written, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := yaml.Unmarshal(written, &got); err != nil {
				t.Fatal(err)
			}
			for path, want := range map[string]any{
				"mode":                            string(mode),
				"hostnameOverride":                "node-a",
				"clientConnection.kubeconfig":     "/run/kubeconfig",
				"clusterCIDR":                     "10.244.0.0/16",
				"detectLocalMode":                 "ClusterCIDR",
				"healthzBindAddress":              "127.0.0.1:10256",
				"metricsBindAddress":              "127.0.0.1:10249",
				"bindAddressHardFail":             true,
				"oomScoreAdj":                     float64(0),
				"conntrack.maxPerCore":            float64(0),
				"conntrack.min":                   float64(0),
				"conntrack.tcpEstablishedTimeout": "0s",
				"conntrack.tcpCloseWaitTimeout":   "0s",
				"conntrack.tcpBeLiberal":          false,
				"conntrack.udpTimeout":            "0s",
				"conntrack.udpStreamTimeout":      "0s",
				"logging.verbosity":               float64(DefaultVerbosity),
			} {
				var v any = got
				for _, k := range strings.Split(path, ".") {
					m, _ := v.(map[string]any)
					v = m[k]
				}
				if !reflect.DeepEqual(v, want) {
					t.Errorf("%s = %#v, want %#v", path, v, want)
				}
			}
		})
	}
}

func TestSyncMetrics(t *testing.T) {
	text := `# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7645e+09
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1.7645e+09
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1.7645e+09
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
`
	synced, queued := syncMetrics([]byte(text))
	if !reflect.DeepEqual(synced, map[string]float64{"IPv4": 1.7645e+09}) {
		t.Errorf("synced = %v", synced)
	}
	if !reflect.DeepEqual(sortedKeys(queued), []string{"IPv4", "IPv6"}) {
		t.Errorf("queued = %v", queued)
	}
}

func TestStatusReady(t *testing.T) {
	for _, tc := range []struct {
		st   Status
		want bool
	}{
		{Status{}, false},
		{Status{PID: 1, Healthz: true}, false},
		{Status{PID: 1, Healthz: true, Synced: []string{"IPv4"}, Pending: []string{"IPv6"}}, false},
		{Status{PID: 1, Healthz: false, Synced: []string{"IPv4"}}, false},
		{Status{PID: 1, Healthz: true, Synced: []string{"IPv4", "IPv6"}}, true},
	} {
		if got := tc.st.Ready(); got != tc.want {
			t.Errorf("%+v.Ready() = %v, want %v", tc.st, got, tc.want)
		}
	}
}

func TestKubeChains(t *testing.T) {
	dump := `# Generated by iptables-nft-save
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-NPX46M4PTMTKRN6Y - [0:0]
COMMIT
`
	want := []tableChain{{"mangle", "KUBE-PROXY-CANARY"}, {"filter", "KUBE-FIREWALL"}, {"nat", "KUBE-SERVICES"}, {"nat", "KUBE-SVC-NPX46M4PTMTKRN6Y"}}
	if got := kubeChains([]byte(dump)); !reflect.DeepEqual(got, want) {
		t.Errorf("kubeChains = %v, want %v", got, want)
	}
}

func TestFixtureRefusesToRunOutsideANodeNamespace(t *testing.T) {
	f := &Fixture{Binary: "/nonexistent/kube-proxy", Dir: t.TempDir(), Config: Config{NodeName: "node-a", Kubeconfig: "/k"}}
	_, err := f.Start(t.Context())
	if err == nil {
		t.Fatal("Start without a network namespace succeeded")
	}
	for _, want := range []string{"only inside a node's network namespace", "make control-plane", "DPC_KUBE_PROXY"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q does not say %q", err, want)
		}
	}
}
