package netns_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/controlplane"
	"github.com/dpconform/dpconform/topologies/netns"
)

// annotatePodPlugin is the name under which this test binary acts as a chained CNI
// plugin that, like Calico's, writes the Pod during ADD.
const annotatePodPlugin = "annotate-pod"

// The annotations the plugin writes: the pod's address from prevResult, as Calico's
// cni.projectcalico.org/podIP, and the state directory it was configured with.
const (
	annotationPodIP    = "dpconform.test/podIP"
	annotationStateDir = "dpconform.test/stateDir"
)

// annotatingCNIConfig is ptp + host-local followed by the annotate-pod plugin, which
// finds the API server through ${KUBECONFIG}, as real plugins do.
const annotatingCNIConfig = `{
  "cniVersion": "1.0.0",
  "name": "dpconform-annotate",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${POD_CIDR}"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "${CNI_DATA_DIR}/ipam"
      }
    },
    {"type": "annotate-pod", "kubeconfig": "${KUBECONFIG}", "stateDir": "${STATE_DIR}"}
  ]
}`

// isCNIPlugin reports whether the runtime invoked this binary as the annotate-pod
// plugin (through a link of that name in the CNI plugin directory).
func isCNIPlugin() bool {
	return filepath.Base(os.Args[0]) == annotatePodPlugin && os.Getenv("CNI_COMMAND") != ""
}

// annotatePodMain is the annotate-pod plugin's main; skel handles VERSION and the
// environment, and exits non-zero with a CNI error on failure.
func annotatePodMain() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:   annotatePodAdd,
		Check: annotatePodCheck,
		// The annotation goes with the Pod; there is nothing to undo, and DEL must
		// succeed when there is nothing to remove.
		Del: func(*skel.CmdArgs) error { return nil },
	}, version.All, "annotate-pod: a chained CNI plugin that annotates the Pod during ADD (dpconform tests)")
}

type annotatePodConf struct {
	cnitypes.PluginConf
	Kubeconfig string `json:"kubeconfig"`
	StateDir   string `json:"stateDir"`
}

// k8sArgs are the CNI_ARGS a kubelet passes that the plugin uses; LoadArgs matches
// them by field name.
type k8sArgs struct {
	cnitypes.CommonArgs
	K8S_POD_NAMESPACE cnitypes.UnmarshallableString
	K8S_POD_NAME      cnitypes.UnmarshallableString
}

// parseAnnotatePod reads the plugin's configuration, its prevResult, and the Pod's
// name from CNI_ARGS, and builds a client from the configured kubeconfig.
func parseAnnotatePod(args *skel.CmdArgs) (*annotatePodConf, *types100.Result, kubernetes.Interface, k8sArgs, error) {
	var conf annotatePodConf
	var ka k8sArgs
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		return nil, nil, nil, ka, fmt.Errorf("parse configuration: %w", err)
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, nil, nil, ka, err
	}
	if conf.PrevResult == nil {
		return nil, nil, nil, ka, errors.New("annotate-pod is a chained plugin: it needs a prevResult")
	}
	prev, err := types100.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, nil, nil, ka, fmt.Errorf("convert prevResult: %w", err)
	}
	if err := cnitypes.LoadArgs(args.Args, &ka); err != nil {
		return nil, nil, nil, ka, fmt.Errorf("parse CNI_ARGS: %w", err)
	}
	if ka.K8S_POD_NAMESPACE == "" || ka.K8S_POD_NAME == "" {
		return nil, nil, nil, ka, fmt.Errorf("CNI_ARGS %q lacks K8S_POD_NAMESPACE or K8S_POD_NAME", args.Args)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", conf.Kubeconfig)
	if err != nil {
		return nil, nil, nil, ka, fmt.Errorf("kubeconfig %q: %w", conf.Kubeconfig, err)
	}
	rc.Timeout = 10 * time.Second
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, ka, err
	}
	return &conf, prev, kube, ka, nil
}

// annotatePodAdd writes the pod's IPv4 address and the state directory onto the Pod,
// as Calico's plugin does, and passes prevResult on unchanged.
func annotatePodAdd(args *skel.CmdArgs) error {
	conf, prev, kube, ka, err := parseAnnotatePod(args)
	if err != nil {
		return err
	}
	if st, err := os.Stat(conf.StateDir); err != nil || !st.IsDir() {
		return fmt.Errorf("stateDir %q is not a directory (%v)", conf.StateDir, err)
	}
	ip := ""
	for _, c := range prev.IPs {
		if a, ok := netip.AddrFromSlice(c.Address.IP); ok && a.Unmap().Is4() {
			ip = a.Unmap().String()
			break
		}
	}
	if ip == "" {
		return fmt.Errorf("prevResult has no IPv4 address: %+v", prev.IPs)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		annotationPodIP: ip, annotationStateDir: conf.StateDir,
	}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, name := string(ka.K8S_POD_NAMESPACE), string(ka.K8S_POD_NAME)
	if _, err := kube.CoreV1().Pods(ns).Patch(ctx, name, k8stypes.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate Pod %s/%s: %w", ns, name, err)
	}
	return cnitypes.PrintResult(conf.PrevResult, conf.CNIVersion)
}

// annotatePodCheck fails if the Pod lacks the annotation ADD wrote.
func annotatePodCheck(args *skel.CmdArgs) error {
	_, _, kube, ka, err := parseAnnotatePod(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, name := string(ka.K8S_POD_NAMESPACE), string(ka.K8S_POD_NAME)
	pod, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get Pod %s/%s: %w", ns, name, err)
	}
	if _, ok := pod.Annotations[annotationPodIP]; !ok {
		return fmt.Errorf("pod %s/%s lacks annotation %s", ns, name, annotationPodIP)
	}
	return nil
}

// cniDirWithAnnotatePod makes a CNI plugin directory with the real plugins of dir and
// this test binary as annotate-pod.
func cniDirWithAnnotatePod(dir string) string {
	self, err := os.Executable()
	Expect(err).NotTo(HaveOccurred())
	out := GinkgoT().TempDir()
	for _, p := range []string{"ptp", "host-local", "loopback"} {
		Expect(os.Symlink(filepath.Join(dir, p), filepath.Join(out, p))).To(Succeed())
	}
	Expect(os.Symlink(self, filepath.Join(out, annotatePodPlugin))).To(Succeed())
	return out
}

var _ = Describe("a CNI plugin that writes the Pod during ADD, as Calico's does", func() {
	It("still gets the Pod its status, IP and Ready, and keeps what the plugin wrote", func(sctx SpecContext) {
		bins, err := controlplane.FindBinaries()
		Expect(err).NotTo(HaveOccurred())
		bins.CNIDir = cniDirWithAnnotatePod(bins.CNIDir)
		topo, err := netns.New(sctx, netns.Options{
			Nodes:     1,
			Binaries:  &bins,
			CNIConfig: []byte(annotatingCNIConfig),
			Logf:      func(f string, a ...any) { GinkgoWriter.Printf(f+"\n", a...) },
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			id, dir := topo.RunID(), topo.Dir()
			Expect(topo.Close()).To(Succeed())
			Expect(netns.Leftovers("", id)).To(BeEmpty(), "run directory was %s", dir)
		})

		p, err := topo.AddPod(sctx, topologies.PodSpec{Name: "annotated", Node: "node-a"})
		Expect(err).NotTo(HaveOccurred())
		obj, err := topo.Kube().CoreV1().Pods("default").Get(sctx, "annotated", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		env := map[string]string{}
		for _, kv := range topo.Node("node-a").DriverEnv() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		Expect(obj.Annotations).To(HaveKeyWithValue(annotationPodIP, p.IP().String()))
		Expect(obj.Annotations).To(HaveKeyWithValue(annotationStateDir, env["DPC_STATE_DIR"]))
		Expect(obj.Status.Phase).To(Equal(corev1.PodRunning))
		Expect(obj.Status.PodIP).To(Equal(p.IP().String()))
		Expect(obj.Status.HostIP).To(Equal(topo.Node("node-a").IP().String()))
		Expect(obj.Status.Conditions).To(ContainElement(And(
			HaveField("Type", corev1.PodReady), HaveField("Status", corev1.ConditionTrue))))

		By("removing the pod, which runs CNI DEL through the plugin")
		Expect(topo.RemovePod(sctx, p)).To(Succeed())
	}, NodeTimeout(90*time.Second))
})
