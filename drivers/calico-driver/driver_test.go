package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpconform/dpconform/driver/drivertest"
	"github.com/dpconform/dpconform/driver/skel"
	"github.com/dpconform/dpconform/topologies/netns"
)

// fakeBuild makes a directory shaped as `make calico` makes it, with buildinfo as its
// BUILDINFO, and returns it.
func fakeBuild(t *testing.T, buildinfo string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []struct {
		name string
		mode os.FileMode
	}{
		{"bin/calico-felix", 0o755}, {"bin/calico-bpf", 0o755}, {"cni/calico", 0o755},
		{"bpf/tc_preamble_ingress.o", 0o644}, {"crds/crd.projectcalico.org_ippools.yaml", 0o644},
	} {
		p := filepath.Join(dir, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if buildinfo != "" {
		if err := os.WriteFile(filepath.Join(dir, "BUILDINFO"), []byte(buildinfo), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const goodBuildInfo = `version: 'v3.31.5'
commit: '2e4da40144aac869e1ed2cc220b6c4b62f32efdd'
dirty: false
libbpf: 'v1.4.6'
go: 'go1.26.8'
clang: 'Debian clang version 19.1.7 (3~deb12u1)'
built: '2026-12-02T03:00:00Z'
pinned:
  - 'k8s.io/kubernetes v1.33.10 -> v1.33.9'
`

func TestLoadBuild(t *testing.T) {
	for _, c := range []struct {
		name    string
		dir     func(t *testing.T) string
		wantErr string
	}{
		{"a complete build", func(t *testing.T) string { return fakeBuild(t, goodBuildInfo) }, ""},
		{"a relative path", func(*testing.T) string { return "cache/calico/v3.31.5" }, "not an absolute path"},
		{"no BUILDINFO (an interrupted build)", func(t *testing.T) string { return fakeBuild(t, "") }, "no complete build"},
		{"a BUILDINFO with an unknown field", func(t *testing.T) string { return fakeBuild(t, goodBuildInfo+"colour: blue\n") }, `unknown field "colour"`},
		{"no version", func(t *testing.T) string { return fakeBuild(t, "commit: abc\n") }, "no version"},
		{"no Felix", func(t *testing.T) string {
			d := fakeBuild(t, goodBuildInfo)
			os.Remove(filepath.Join(d, "bin/calico-felix"))
			return d
		}, "bin/calico-felix"},
		{"a CNI plugin that is not executable", func(t *testing.T) string {
			d := fakeBuild(t, goodBuildInfo)
			os.Chmod(filepath.Join(d, "cni/calico"), 0o644)
			return d
		}, "cni/calico: not an executable file"},
		{"no BPF objects", func(t *testing.T) string {
			d := fakeBuild(t, goodBuildInfo)
			os.Remove(filepath.Join(d, "bpf/tc_preamble_ingress.o"))
			return d
		}, "bpf/*.o"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := LoadBuild(c.dir(t))
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("LoadBuild: %v", err)
				}
				if b.Version != "v3.31.5" || b.Commit != "2e4da40144aac869e1ed2cc220b6c4b62f32efdd" || len(b.Pinned) != 1 {
					t.Errorf("read %+v", b.BuildInfo)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("LoadBuild = %v, want an error containing %q", err, c.wantErr)
			}
		})
	}
}

// The version a report carries says exactly what was built: the commit, and the
// dependencies that are not the release's.
func TestDescribe(t *testing.T) {
	for _, c := range []struct {
		info BuildInfo
		want string
	}{
		{BuildInfo{Version: "v3.31.6", Commit: "cc4364f81fbb"}, "v3.31.6 (commit cc4364f81fbb)"},
		{BuildInfo{Version: "v3.31.6", Commit: "unknown"}, "v3.31.6"},
		{BuildInfo{Version: "v3.33.0-0.dev-1478-g6609dea54713+seed2-forward-fallthrough-accept", Commit: "6609dea54713", Patch: "seed2-forward-fallthrough-accept (sha256 ab12)"},
			"v3.33.0-0.dev-1478-g6609dea54713+seed2-forward-fallthrough-accept (commit 6609dea54713; patched: seed2-forward-fallthrough-accept (sha256 ab12))"},
		{BuildInfo{Version: "v3.31.5", Commit: "2e4da40144aa", Pinned: []string{"k8s.io/kubernetes v1.33.10 -> v1.33.9", "k8s.io/kubelet v0.33.10 -> v0.33.9"}},
			"v3.31.5 (commit 2e4da40144aa; 2 dependencies at other patch versions: k8s.io/kubernetes v1.33.10 -> v1.33.9, k8s.io/kubelet v0.33.10 -> v0.33.9)"},
	} {
		if got := (&Build{BuildInfo: c.info}).Describe(); got != c.want {
			t.Errorf("Describe(%+v) = %q, want %q", c.info, got, c.want)
		}
	}
}

func TestPoolCIDR(t *testing.T) {
	node := func(name, cidr string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: cidr}}
	}
	for _, c := range []struct {
		name    string
		nodes   []corev1.Node
		want    string
		wantErr string
	}{
		{"the netns topology's two nodes", []corev1.Node{node("node-a", "10.244.0.0/24"), node("node-b", "10.244.1.0/24")}, "10.244.0.0/23", ""},
		{"three nodes", []corev1.Node{node("a", "10.244.0.0/24"), node("b", "10.244.1.0/24"), node("c", "10.244.2.0/24")}, "10.244.0.0/22", ""},
		{"one node", []corev1.Node{node("a", "10.244.3.0/24")}, "10.244.3.0/24", ""},
		{"an unmasked podCIDR", []corev1.Node{node("a", "10.244.3.7/24")}, "10.244.3.0/24", ""},
		{"a node without a podCIDR", []corev1.Node{node("a", "10.244.0.0/24"), node("b", "")}, "", "no podCIDR on Node b"},
		{"an IPv6 podCIDR", []corev1.Node{node("a", "fd00::/64")}, "", "not an IPv4 prefix"},
		{"no nodes", nil, "", "no Nodes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := poolCIDR(c.nodes)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Errorf("poolCIDR = %v, %v; want an error containing %q", got, err, c.wantErr)
				}
				return
			}
			if err != nil || got.String() != c.want {
				t.Errorf("poolCIDR = %v, %v; want %s", got, err, c.want)
			}
		})
	}
}

// The CNI configuration expands with the topology's variables into Calico's plugin
// with host-local IPAM on the node's podCIDR.
func TestCNIConfig(t *testing.T) {
	out, err := netns.ExpandCNIConfig(cniConfig(), map[string]string{
		"POD_CIDR": "10.244.1.0/24", "NODE_NAME": "node-b", "NODE_IP": "10.213.0.11",
		"CNI_DATA_DIR": "/run/x/cni", "KUBECONFIG": "/run/x/kubeconfig", "STATE_DIR": "/run/x/state",
	})
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(out, &conf); err != nil {
		t.Fatalf("expanded configuration is not JSON: %v\n%s", err, out)
	}
	if len(conf.Plugins) != 1 {
		t.Fatalf("%d plugins, want Calico's alone", len(conf.Plugins))
	}
	p := conf.Plugins[0]
	for k, want := range map[string]any{
		"type": "calico", "nodename": "node-b", "nodename_file_optional": true, "datastore_type": "kubernetes",
		"log_file_path": "/run/x/state/calico/cni.log",
	} {
		if p[k] != want {
			t.Errorf("%s = %v, want %v", k, p[k], want)
		}
	}
	if kc := p["kubernetes"].(map[string]any)["kubeconfig"]; kc != "/run/x/kubeconfig" {
		t.Errorf("kubeconfig = %v", kc)
	}
	ipam, _ := json.Marshal(p["ipam"])
	if !bytes.Contains(ipam, []byte(`"subnet":"10.244.1.0/24"`)) || !bytes.Contains(ipam, []byte(`"type":"host-local"`)) {
		t.Errorf("ipam = %s", ipam)
	}
}

// run calls the driver's verb in this process, with env as its whole environment
// besides DPC_CALICO_DIR (set by the caller with t.Setenv).
func run(t *testing.T, env map[string]string, args ...string) (int, map[string]any) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := skel.Run(context.Background(), "calico-driver", verbs(), args, func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}, &stdout, &stderr)
	var out map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("stdout is not one JSON object: %q", stdout.String())
	}
	return code, out
}

func TestInfo(t *testing.T) {
	dir := fakeBuild(t, goodBuildInfo)
	t.Setenv(EnvDir, dir)
	code, out := run(t, nil, "info")
	if code != 0 {
		t.Fatalf("info: %v", out)
	}
	if out["name"] != "calico" || !strings.HasPrefix(out["version"].(string), "v3.31.5 (commit 2e4da40144aac869e1ed2cc220b6c4b62f32efdd;") {
		t.Errorf("info = %v", out)
	}
	if out["cni_dir"] != filepath.Join(dir, "cni") {
		t.Errorf("cni_dir = %v, want the build's cni/", out["cni_dir"])
	}
	if got, _ := json.Marshal(out["profiles"]); string(got) != `["Core","ModeSwitch","Policy"]` {
		t.Errorf("profiles = %s", got)
	}
	if got, _ := json.Marshal(out["features"]); string(got) != `["ClusterIP","NetworkPolicy","NodePort","NodePortRemoteBackend","TCP","UDP"]` {
		t.Errorf("features = %s", got)
	}
}

func TestRefusals(t *testing.T) {
	env := drivertest.NodeEnv(t)
	good := func() map[string]string { return envMap(env) }
	build := fakeBuild(t, goodBuildInfo)
	for _, c := range []struct {
		name       string
		dir        string
		env        func() map[string]string
		args       []string
		wantErr    string
		wantDetail []string
	}{
		{"info without a build", "", good, []string{"info"}, "missing binaries", []string{EnvDir + " is not set", "make calico CALICO_SRC="}},
		{"start without a build", "", good, []string{"start"}, "missing binaries", []string{"make calico"}},
		{"an interrupted build", fakeBuild(t, ""), good, []string{"start"}, "missing binaries", []string{"no complete build", "make calico"}},
		{"a kind topology", build, func() map[string]string { e := good(); e["DPC_TOPOLOGY"] = "kind"; delete(e, "DPC_NETNS"); return e }, []string{"start"}, "unsupported topology", []string{"DPC_TOPOLOGY=kind"}},
		{"no network namespace", build, func() map[string]string { e := good(); delete(e, "DPC_NETNS"); return e }, []string{"start"}, "bad environment", []string{"DPC_NETNS"}},
		{"no kubeconfig file", build, func() map[string]string { e := good(); e["DPC_KUBECONFIG"] = "/nonexistent/kubeconfig"; return e }, []string{"start"}, "bad environment", []string{"/nonexistent/kubeconfig"}},
		{"a mode", build, good, []string{"start", "--mode", "iptables"}, "not offered", []string{`does not offer mode "iptables"`}},
		{"events", build, good, []string{"events"}, "unsupported", []string{"Observability"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(EnvDir, c.dir)
			code, out := run(t, c.env(), c.args...)
			if code == 0 || out["error"] != c.wantErr {
				t.Fatalf("%v: exit %d, %v; want error %q", c.args, code, out, c.wantErr)
			}
			for _, d := range c.wantDetail {
				if !strings.Contains(out["detail"].(string), d) {
					t.Errorf("detail %q lacks %q", out["detail"], d)
				}
			}
		})
	}
}

// Mount points the driver makes carry a marker, and only marked, otherwise empty
// directories are removed again.
func TestMarkedDirs(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(root, "usr/lib/calico/bpf")
	if err := os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mkdirMarked(target); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"usr/lib/calico", "usr/lib/calico/bpf"} {
		if _, err := os.Stat(filepath.Join(root, d, markerFile)); err != nil {
			t.Errorf("%s has no marker: %v", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "usr/lib", markerFile)); err == nil {
		t.Error("a directory that existed got a marker")
	}
	// Something else lives in /usr/lib/calico: it stays, and so does the directory.
	other := filepath.Join(root, "usr/lib/calico/other")
	if err := os.WriteFile(other, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := removeMarked(target); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); err == nil {
		t.Error("the marked, empty mount point was not removed")
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("removed what the driver did not make: %v", err)
	}
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	if err := removeMarked(target); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/lib/calico")); err == nil {
		t.Error("the marked parent was not removed once empty")
	}
	if _, err := os.Stat(filepath.Join(root, "usr/lib")); err != nil {
		t.Errorf("removed a directory the driver did not make: %v", err)
	}
}

// Cleanup removes Calico's chains and the jumps to them, and nothing else.
func TestRemoveChainsScript(t *testing.T) {
	dump := `# Generated by iptables-save v1.8.9 (nf_tables)
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:cali-PREROUTING - [0:0]
-A PREROUTING -m comment --comment "cali:6gwbT8clXdHdC1b1" -j cali-PREROUTING
-A cali-PREROUTING -m comment --comment "cali:x" -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -j KUBE-SERVICES
COMMIT
*filter
:FORWARD ACCEPT [0:0]
:cali-FORWARD - [0:0]
:cali-from-hep-forward - [0:0]
-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD
-A FORWARD -m set --match-set cali40all-ipam-pools src -j ACCEPT
-A cali-FORWARD -j cali-from-hep-forward
COMMIT
`
	want := `*raw
-D PREROUTING -m comment --comment "cali:6gwbT8clXdHdC1b1" -j cali-PREROUTING
-F cali-PREROUTING
-X cali-PREROUTING
COMMIT
*filter
-D FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD
-F cali-FORWARD
-F cali-from-hep-forward
-X cali-FORWARD
-X cali-from-hep-forward
COMMIT
`
	if got := removeChainsScript(dump); got != want {
		t.Errorf("script:\n%s\nwant:\n%s", got, want)
	}
	if got := removeChainsScript("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n"); got != "" {
		t.Errorf("a dump without Calico's chains gives %q, want nothing", got)
	}
}
