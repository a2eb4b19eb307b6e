// Package nodeimage builds a kind node image offline, from what a machine without a
// container registry can reach: a Debian root filesystem made by debootstrap from the
// Debian mirror apt already uses, kind's own base-image files from the
// sigs.k8s.io/kind module directory (its entrypoint, systemd units, containerd and
// kubelet configuration), and Kubernetes' binaries built from their Go modules
// (topologies/binaries). The component images kubeadm runs (kube-apiserver,
// kube-controller-manager, kube-scheduler, kube-proxy, etcd, pause) are made from the
// same binaries and preloaded into the node's containerd, so that kubeadm, which kind
// runs without its preflight phase, pulls nothing. CoreDNS is not built: the kind
// topology disables kubeadm's DNS addon (no spec resolves a name).
//
// Each image is kept in the project's Docker data-root under a tag that names its
// versions, and is not built again while it is there.
package nodeimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/dpconform/dpconform/topologies/controlplane"
	"github.com/dpconform/dpconform/topologies/kind/dockerd"
)

// KindVersion is the version of sigs.k8s.io/kind whose base-image files the node
// image is built from and whose Go API the kind topology uses; it must match go.mod (a
// test checks that it does).
const KindVersion = "v0.33.0"

// recipe is bumped whenever what Build makes changes for the same versions, so that a
// cached image of an older recipe is not taken for a current one.
const recipe = "1"

// Suite is the Debian release of the node's root filesystem.
const Suite = "bookworm"

// Packages are what debootstrap installs: what kind's base image installs from apt
// (systemd, the tools kubelet and kube-proxy call, containerd and runc), with Debian's
// CNI plugins in place of kind's downloaded ones.
var Packages = []string{
	"systemd", "dbus", "conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux", "mount",
	"kmod", "libseccomp2", "pigz", "fuse-overlayfs", "e2fsprogs", "bash", "ca-certificates",
	"curl", "jq", "procps", "containerd", "runc", "containernetworking-plugins",
}

// Images are the component images kubeadm v1.37.2 runs (`kubeadm config images list`
// but CoreDNS), by name, with the binary each holds. etcd's tag is kubeadm's; the
// binary is the etcd the control plane is built with (controlplane.EtcdVersion).
var Images = []struct{ Name, Binary string }{
	{"registry.k8s.io/kube-apiserver:" + controlplane.KubernetesVersion, "kube-apiserver"},
	{"registry.k8s.io/kube-controller-manager:" + controlplane.KubernetesVersion, "kube-controller-manager"},
	{"registry.k8s.io/kube-scheduler:" + controlplane.KubernetesVersion, "kube-scheduler"},
	{"registry.k8s.io/kube-proxy:" + controlplane.KubernetesVersion, "kube-proxy"},
	{"registry.k8s.io/etcd:3.7.0-0", "etcd"},
}

// PauseImages are the sandbox image's names: kubeadm's, and the one kind's containerd
// configuration names.
var PauseImages = []string{"registry.k8s.io/pause:3.10.2", "registry.k8s.io/pause:3.10"}

// NodeBinaries are installed in the node's /usr/bin.
var NodeBinaries = []string{"kubelet", "kubeadm", "kubectl"}

// Tag is the node image's name for the current versions.
func Tag() string {
	return fmt.Sprintf("dpconform.local/kind-node:%s-kind%s-r%s", controlplane.KubernetesVersion, KindVersion, recipe)
}

// RootfsTag is the name of the Debian root filesystem image: the node's base, and
// the base of the component images (and of an implementation's own image on an
// offline machine: it has iptables and nftables).
func RootfsTag() string { return fmt.Sprintf("dpconform.local/kind-rootfs:%s-r%s", Suite, recipe) }

// Options configure Build.
type Options struct {
	Daemon *dockerd.Daemon
	// KindDir is the sigs.k8s.io/kind module directory (its images/base/files).
	KindDir string
	// Binaries is the directory holding kubelet, kubeadm, kubectl, kube-scheduler,
	// kube-apiserver, kube-controller-manager, kube-proxy and etcd.
	Binaries string
	// Pause is a static pause binary (topologies/kind/cmd/pause).
	Pause string
	// Mirror is the Debian mirror; empty means the first of apt's sources.
	Mirror string
	// WorkDir holds the root filesystem while debootstrap builds it (it needs a
	// filesystem that allows device nodes: not a nodev tmpfs).
	WorkDir string
	Logf    func(format string, args ...any)
}

// Exists reports whether the daemon holds image.
func Exists(ctx context.Context, d *dockerd.Daemon, image string) bool {
	_, err := d.Docker(ctx, "image", "inspect", "--format", "{{.Id}}", image)
	return err == nil
}

// Build builds what is missing of the node image and returns its name.
func Build(ctx context.Context, o Options) (string, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	tag := Tag()
	if Exists(ctx, o.Daemon, tag) {
		o.Logf("kind node image: cached as %s", tag)
		return tag, nil
	}
	if err := o.check(); err != nil {
		return "", err
	}
	start := time.Now()
	if err := o.rootfs(ctx); err != nil {
		return "", fmt.Errorf("root filesystem: %w", err)
	}
	if err := o.components(ctx); err != nil {
		return "", fmt.Errorf("component images: %w", err)
	}
	if err := o.node(ctx, tag); err != nil {
		return "", fmt.Errorf("node image: %w", err)
	}
	o.Logf("kind node image: built %s in %s", tag, time.Since(start).Round(time.Second))
	return tag, nil
}

func (o Options) check() error {
	var errs []error
	for _, b := range append(append([]string{}, NodeBinaries...), "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd") {
		if st, err := os.Stat(filepath.Join(o.Binaries, b)); err != nil || st.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("missing binary %s (run `make control-plane kind-node-binaries`)", filepath.Join(o.Binaries, b)))
		}
	}
	if _, err := os.Stat(filepath.Join(o.KindDir, "images", "base", "files", "usr", "local", "bin", "entrypoint")); err != nil {
		errs = append(errs, fmt.Errorf("kind's base-image files are not in %s (the sigs.k8s.io/kind %s module directory; `go mod download sigs.k8s.io/kind`): %w", o.KindDir, KindVersion, err))
	}
	if _, err := os.Stat(o.Pause); err != nil {
		errs = append(errs, fmt.Errorf("pause binary: %w", err))
	}
	return errors.Join(errs...)
}

// rootfs debootstraps the Debian root filesystem and imports it, unless it is cached.
func (o Options) rootfs(ctx context.Context) error {
	tag := RootfsTag()
	if Exists(ctx, o.Daemon, tag) {
		o.Logf("kind node image: 1/3 root filesystem cached as %s", tag)
		return nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return errors.New("debootstrap not found: install it (`make deps-kind`)")
	}
	mirror := o.Mirror
	if mirror == "" {
		var err error
		if mirror, err = aptMirror(); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(o.WorkDir, "rootfs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	o.Logf("kind node image: 1/3 root filesystem: debootstrap %s from %s (about a minute)", Suite, mirror)
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include="+strings.Join(Packages, ","), Suite, dir, mirror)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("debootstrap: %w: %s", err, lastLines(out, 20))
	}
	// What a node never reads: documentation, apt's lists and caches.
	for _, g := range []string{"usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*", "var/lib/apt/lists/*", "var/cache/apt/*", "var/cache/debconf/*-old", "var/log/*"} {
		m, _ := filepath.Glob(filepath.Join(dir, g))
		for _, p := range m {
			os.RemoveAll(p)
		}
	}
	tarCmd := exec.CommandContext(ctx, "tar", "-C", dir, "--numeric-owner", "--xattrs", "-cf", "-", ".")
	imp := o.Daemon.Command(ctx, "import", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "-", tag)
	if err := pipe(tarCmd, imp); err != nil {
		return fmt.Errorf("import %s: %w", tag, err)
	}
	o.Logf("kind node image: 1/3 root filesystem imported as %s in %s", tag, time.Since(start).Round(time.Second))
	return nil
}

// aptMirror returns the first Debian mirror of apt's sources for Suite.
func aptMirror() (string, error) {
	var files []string
	files = append(files, "/etc/apt/sources.list")
	more, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, more...)
	more, _ = filepath.Glob("/etc/apt/sources.list.d/*.list")
	files = append(files, more...)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if m := mirrorIn(string(data)); m != "" {
			return m, nil
		}
	}
	return "", fmt.Errorf("no Debian mirror for %s in apt's sources (%s): set DPC_DEBIAN_MIRROR", Suite, strings.Join(files, ", "))
}

// mirrorIn finds a mirror serving Suite's main component in a sources file, in either
// the one-line or the deb822 format.
func mirrorIn(text string) string {
	// deb822: stanzas of "Key: value" lines.
	for _, stanza := range strings.Split(text, "\n\n") {
		fields := map[string]string{}
		for _, l := range strings.Split(stanza, "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && !strings.HasPrefix(strings.TrimSpace(l), "#") {
				fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
		if slicesContain(strings.Fields(fields["Types"]), "deb") && slicesContain(strings.Fields(fields["Suites"]), Suite) &&
			slicesContain(strings.Fields(fields["Components"]), "main") {
			if uris := strings.Fields(fields["URIs"]); len(uris) > 0 {
				return uris[0]
			}
		}
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// deb [options] URI suite component...
		if len(f) < 4 || f[0] != "deb" {
			continue
		}
		i := 1
		if strings.HasPrefix(f[1], "[") {
			for i < len(f) && !strings.HasSuffix(f[i], "]") {
				i++
			}
			i++
		}
		if i+2 < len(f)+0 && f[i+1] == Suite && slicesContain(f[i+2:], "main") {
			return f[i]
		}
	}
	return ""
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// components makes the component images from the root filesystem and the binaries,
// and the pause image from the pause binary alone.
func (o Options) components(ctx context.Context) error {
	o.Logf("kind node image: 2/3 component images (%d, and pause)", len(Images))
	for _, im := range Images {
		if Exists(ctx, o.Daemon, im.Name) {
			continue
		}
		bin := filepath.Join(o.Binaries, im.Binary)
		if err := o.imageWith(ctx, RootfsTag(), im.Name, []File{{Src: bin, Dst: "usr/local/bin/" + im.Binary, Mode: 0o755}},
			`ENTRYPOINT ["/usr/local/bin/`+im.Binary+`"]`); err != nil {
			return err
		}
	}
	if Exists(ctx, o.Daemon, PauseImages[0]) {
		return nil
	}
	buf, err := Tar([]File{{Src: o.Pause, Dst: "pause", Mode: 0o755}})
	if err != nil {
		return err
	}
	if _, err := o.Daemon.DockerIn(ctx, buf, "import", "--change", `ENTRYPOINT ["/pause"]`, "-", PauseImages[0]); err != nil {
		return err
	}
	for _, t := range PauseImages[1:] {
		if _, err := o.Daemon.Docker(ctx, "tag", PauseImages[0], t); err != nil {
			return err
		}
	}
	return nil
}

// imageWith commits an image of base with files added and the Dockerfile-style
// changes applied.
func (o Options) imageWith(ctx context.Context, base, name string, files []File, changes ...string) error {
	out, err := o.Daemon.Docker(ctx, "create", "--network", "none", base, "/bin/true")
	if err != nil {
		return err
	}
	id := strings.TrimSpace(string(out))
	defer o.Daemon.Docker(context.WithoutCancel(ctx), "rm", "-f", id)
	if err := o.copyIn(ctx, id, files); err != nil {
		return err
	}
	args := []string{"commit"}
	for _, c := range append(changes, "CMD []") {
		args = append(args, "--change", c)
	}
	_, err = o.Daemon.Docker(ctx, append(args, id, name)...)
	return err
}

// File is a file to put into an image: Src on the host (or Data), Dst relative to
// the image's root.
type File struct {
	Src  string
	Data []byte
	Dst  string
	Mode int64
}

// Tar returns files as a tar stream, for `docker import` or `docker cp`.
func Tar(files []File) ([]byte, error) {
	var buf bytes.Buffer
	err := writeTar(&buf, files)
	return buf.Bytes(), err
}

func (o Options) copyIn(ctx context.Context, container string, files []File) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, files)) }()
	cmd := o.Daemon.Command(ctx, "cp", "-", container+":/")
	cmd.Stdin = pr
	if out, err := cmd.CombinedOutput(); err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("docker cp into %s: %w: %s", container, err, bytes.TrimSpace(out))
	}
	return nil
}

// writeTar writes files as a tar stream, with the directories they need.
func writeTar(w io.Writer, files []File) error {
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := filepath.Dir(f.Dst); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	// Parents first.
	var ds []string
	for d := range dirs {
		ds = append(ds, d)
	}
	sortByDepth(ds)
	for _, d := range ds {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
	}
	for _, f := range files {
		data := f.Data
		if data == nil {
			var err error
			if data, err = os.ReadFile(f.Src); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.Dst, Mode: f.Mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func sortByDepth(ds []string) {
	for i := 1; i < len(ds); i++ {
		for j := i; j > 0 && (strings.Count(ds[j], "/") < strings.Count(ds[j-1], "/") ||
			strings.Count(ds[j], "/") == strings.Count(ds[j-1], "/") && ds[j] < ds[j-1]); j-- {
			ds[j], ds[j-1] = ds[j-1], ds[j]
		}
	}
}

// kindFiles are kind's base-image files as its Dockerfile copies them: scripts (under
// usr/local/bin and kind/bin) 0755, everything else 0644.
func (o Options) kindFiles() ([]File, error) {
	root := filepath.Join(o.KindDir, "images", "base", "files")
	var out []File
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		mode := int64(0o644)
		if strings.HasPrefix(rel, "usr/local/bin/") || strings.HasPrefix(rel, "kind/bin/") {
			mode = 0o755
		}
		out = append(out, File{Src: p, Dst: rel, Mode: mode})
		return nil
	})
	return out, err
}

// setup is the base image's RUN steps of kind's Dockerfile, on Debian's packages: its
// units and configuration expect kind's own build of containerd in /usr/local/bin and
// the CNI plugins in /opt/cni/bin, where Debian has /usr/bin and /usr/lib/cni.
const setup = `set -eu
chmod 755 /kind /kind/bin
find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
  /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
  /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> /etc/systemd/journald.conf
ln -sf /usr/lib/systemd/systemd /sbin/init
systemctl enable kubelet.service containerd.service undo-mount-hacks.service
systemctl mask systemd-binfmt.service
mkdir -p /etc/kubernetes/manifests
ln -sf /usr/bin/containerd /usr/local/bin/containerd
ln -sf /usr/bin/ctr /usr/local/bin/ctr
mkdir -p /opt/cni/bin
for p in /usr/lib/cni/*; do ln -sf "$p" /opt/cni/bin/; done
ctr oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json
`

// node builds the node image: the root filesystem with kind's files and setup, the
// node binaries, and the component images preloaded into its containerd.
func (o Options) node(ctx context.Context, tag string) error {
	start := time.Now()
	o.Logf("kind node image: 3/3 node image %s", tag)
	out, err := o.Daemon.Docker(ctx, "run", "-d", "--privileged", "--network", "none", "--tmpfs", "/run", "--tmpfs", "/tmp",
		"--entrypoint", "sleep", RootfsTag(), "infinity")
	if err != nil {
		return err
	}
	id := strings.TrimSpace(string(out))
	defer o.Daemon.Docker(context.WithoutCancel(ctx), "rm", "-f", id)
	files, err := o.kindFiles()
	if err != nil {
		return err
	}
	for _, b := range NodeBinaries {
		files = append(files, File{Src: filepath.Join(o.Binaries, b), Dst: "usr/bin/" + b, Mode: 0o755})
	}
	files = append(files, File{Data: []byte(controlplane.KubernetesVersion + "\n"), Dst: "kind/version", Mode: 0o644})
	if err := o.copyIn(ctx, id, files); err != nil {
		return err
	}
	if _, err := o.Daemon.Docker(ctx, "exec", id, "bash", "-c", setup); err != nil {
		return err
	}
	// Preload: containerd runs in the build container only for the import.
	if _, err := o.Daemon.Docker(ctx, "exec", "-d", id, "containerd"); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := o.Daemon.Docker(ctx, "exec", id, "ctr", "version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("containerd in the build container did not answer within 30 s")
		}
		time.Sleep(300 * time.Millisecond)
	}
	names := append([]string{}, PauseImages...)
	for _, im := range Images {
		names = append(names, im.Name)
	}
	save := o.Daemon.Command(ctx, append([]string{"save"}, names...)...)
	imp := o.Daemon.Command(ctx, "exec", "-i", id, "ctr", "--namespace=k8s.io", "images", "import",
		"--label=io.cri-containerd.pinned=pinned", "--all-platforms", "--no-unpack", "--digests", "-")
	if err := pipe(save, imp); err != nil {
		return fmt.Errorf("preload the component images: %w", err)
	}
	listed, err := o.Daemon.Docker(ctx, "exec", id, "ctr", "--namespace=k8s.io", "images", "ls", "-q")
	if err != nil {
		return err
	}
	for _, n := range names {
		if !bytes.Contains(listed, []byte(n+"\n")) {
			return fmt.Errorf("%s is not in the node's containerd after the import (it lists %q)", n, listed)
		}
	}
	if _, err := o.Daemon.Docker(ctx, "exec", id, "bash", "-c",
		"pkill -x containerd; for i in $(seq 100); do pgrep -x containerd >/dev/null || break; sleep 0.1; done; rm -rf /run/containerd /tmp/* /var/log/*"); err != nil {
		return err
	}
	// kind's Dockerfile also sets STOPSIGNAL SIGRTMIN+3 (systemd's halt signal), which
	// docker commit cannot; the project never stops a node, it removes it.
	if _, err := o.Daemon.Docker(ctx, "commit",
		"--change", "ENV container=docker",
		"--change", `ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]`,
		"--change", "CMD []",
		id, tag); err != nil {
		return err
	}
	o.Logf("kind node image: 3/3 committed %s in %s", tag, time.Since(start).Round(time.Second))
	return nil
}

// pipe runs from | to and returns the first error, with each one's stderr.
func pipe(from, to *exec.Cmd) error {
	r, w := io.Pipe()
	var ferr, terr bytes.Buffer
	from.Stdout, from.Stderr = w, &ferr
	to.Stdin, to.Stdout, to.Stderr = r, &terr, &terr
	if err := to.Start(); err != nil {
		return err
	}
	if err := from.Start(); err != nil {
		w.Close()
		to.Wait()
		return err
	}
	fe := from.Wait()
	w.CloseWithError(fe)
	te := to.Wait()
	var errs []error
	if fe != nil {
		errs = append(errs, fmt.Errorf("%s: %w: %s", strings.Join(from.Args, " "), fe, bytes.TrimSpace(ferr.Bytes())))
	}
	if te != nil {
		errs = append(errs, fmt.Errorf("%s: %w: %s", strings.Join(to.Args, " "), te, bytes.TrimSpace(terr.Bytes())))
	}
	return errors.Join(errs...)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
