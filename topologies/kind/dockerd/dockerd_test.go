package dockerd_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies/kind/dockerd"
)

func TestMain(m *testing.M) {
	dockerd.RuntimeWrapperMain()
	os.Exit(m.Run())
}

// hostNetwork is what dockerd would change on the host if it ran there: links,
// routes, iptables and nftables rules, forwarding.
func hostNetwork(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, argv := range map[string][]string{
		"links":          {"ip", "-o", "link", "show"},
		"routes":         {"ip", "route", "show", "table", "all"},
		"iptables":       {"iptables-save"},
		"iptables-nat":   {"iptables-save", "-t", "nat"},
		"nftables":       {"nft", "list", "ruleset"},
		"ip_forward":     {"sysctl", "-n", "net.ipv4.ip_forward"},
		"bridge-nf-call": {"sh", "-c", "cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || true"},
	} {
		o, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, o)
		}
		// Counters and generation comments change with any traffic.
		var keep []string
		for _, l := range strings.Split(string(o), "\n") {
			if strings.HasPrefix(l, "#") || strings.HasPrefix(l, ":") {
				continue
			}
			keep = append(keep, l)
		}
		out[name] = strings.Join(keep, "\n")
	}
	return out
}

func diff(a, b map[string]string) []string {
	var d []string
	for k, v := range a {
		if b[k] != v {
			d = append(d, fmt.Sprintf("%s:\n--- before\n%s\n+++ now\n%s", k, v, b[k]))
		}
	}
	return d
}

// sleeperImage imports an image holding only testdata/sleeper, built static.
func sleeperImage(t *testing.T, ctx context.Context, d *dockerd.Daemon) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sleeper")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./testdata/sleeper")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build sleeper: %v: %s", err, o)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "sleeper", Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg})
	tw.Write(data)
	tw.Close()
	const name = "dpconform.test/sleeper:1"
	if _, err := d.DockerIn(ctx, buf.Bytes(), "import", "--change", `ENTRYPOINT ["/sleeper"]`, "-", name); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestDaemonLeavesTheHostAlone starts the daemon, runs a privileged container on a
// network of its own, and checks that the host's networking changed only by the
// daemon's link and route while it ran, and not at all after Stop, which leaves no
// process, namespace or cgroup behind.
func TestDaemonLeavesTheHostAlone(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before := hostNetwork(t)
	root := t.TempDir()
	d, err := dockerd.Start(ctx, dockerd.Options{Root: root, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			d.Stop()
		}
	}()
	img := sleeperImage(t, ctx, d)
	subnet := d.Pool().Addr().String() + "/24"
	if _, err := d.Docker(ctx, "network", "create", "--subnet", subnet, "dpconform-test"); err != nil {
		t.Fatal(err)
	}
	// kind runs its nodes --privileged: without the runtime wrapper this fails here.
	if _, err := d.Docker(ctx, "run", "-d", "--privileged", "--name", "sleeper", "--network", "dpconform-test", img); err != nil {
		t.Fatal(err)
	}
	var logs []byte
	for i := 0; i < 50 && !bytes.Contains(logs, []byte("CapBnd")); i++ {
		time.Sleep(100 * time.Millisecond)
		logs, _ = d.Docker(ctx, "logs", "sleeper")
	}
	if !bytes.Contains(logs, []byte("CapBnd")) {
		t.Fatalf("the privileged container did not run: logs %q", logs)
	}
	during := hostNetwork(t)
	for _, k := range []string{"iptables", "iptables-nat", "nftables", "ip_forward", "bridge-nf-call"} {
		if before[k] != during[k] {
			t.Errorf("dockerd changed the host's %s:\n--- before\n%s\n+++ while it ran\n%s", k, before[k], during[k])
		}
	}
	if strings.Contains(during["links"], "br-") || strings.Contains(during["links"], "docker0") {
		t.Errorf("a docker bridge is in the host's namespace:\n%s", during["links"])
	}
	// The nodes' CPU weight: the container's cgroup is under a parent that weighs
	// as NodeCPUShares host tasks (cpu.shares on cgroup v1, cpu.weight on v2).
	file, want := "/sys/fs/cgroup/cpu/dpconform-docker-*/cpu.shares", dockerd.NodeCPUShares
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.shares"); err != nil {
		file, want = "/sys/fs/cgroup/dpconform-docker-*/cpu.weight", dockerd.NodeCPUWeight
	}
	if ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); want == dockerd.NodeCPUWeight && (err != nil || !slices.Contains(strings.Fields(string(ctrl)), "cpu")) {
		t.Logf("the host's cgroup v2 root does not delegate the cpu controller (%q, %v): no CPU weight to check", ctrl, err)
	} else if m, _ := filepath.Glob(file); len(m) != 1 {
		t.Errorf("want one cgroup parent of the daemon's containers with %s, found %v", filepath.Base(file), m)
	} else if got, err := os.ReadFile(m[0]); err != nil || strings.TrimSpace(string(got)) != fmt.Sprint(want) {
		t.Errorf("%s = %q (%v), want %d", m[0], got, err, want)
	} else if kids, _ := filepath.Glob(filepath.Join(filepath.Dir(m[0]), "*", "cgroup.procs")); len(kids) == 0 {
		t.Errorf("the container's cgroup is not under %s", filepath.Dir(m[0]))
	}
	if _, err := d.Docker(ctx, "rm", "-f", "sleeper"); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	after := hostNetwork(t)
	if d := diff(before, after); len(d) > 0 {
		t.Errorf("the host's networking differs after Stop:\n%s", strings.Join(d, "\n"))
	}
	if _, err := os.Stat(d.NetNS()); !os.IsNotExist(err) {
		t.Errorf("the daemon's namespace %s is still there: %v", d.NetNS(), err)
	}
	if out, _ := exec.Command("pgrep", "-f", dockerd.RunDirBase).CombinedOutput(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("processes of the daemon are left: %s", out)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/dpconform-docker-*"); len(m) > 0 {
		t.Errorf("cgroups of the daemon are left: %v", m)
	}
}
