package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// Config says how to run a control plane.
type Config struct {
	Binaries Binaries
	// Dir is a directory private to this control plane: data, certificates, logs.
	Dir string
	// BindIP is the address kube-apiserver serves on; it must be reachable from every
	// node of the topology.
	BindIP netip.Addr
	// ServiceCIDR is the range of ClusterIPs (default 10.96.0.0/16).
	ServiceCIDR netip.Prefix
	// Env is added to every process's environment (the run's marker, DPC_RUN=...).
	Env []string
	// ReadyTimeout bounds the wait for the API server (default 60 s).
	ReadyTimeout time.Duration
}

// ControlPlane is a running etcd, kube-apiserver and kube-controller-manager.
type ControlPlane struct {
	cfg        Config
	procs      []*Process // in start order
	restConfig *rest.Config
	kube       kubernetes.Interface
	kubeconfig string
	// baseline is what Baseline recorded, by UID, for Reset.
	baseline map[types.UID]baselineObject
}

// Start starts etcd and kube-apiserver, waits until the API server is ready, then starts
// kube-controller-manager with only the EndpointSlice controllers. On error, whatever
// was started is stopped.
func Start(ctx context.Context, cfg Config) (_ *ControlPlane, err error) {
	if !cfg.ServiceCIDR.IsValid() {
		cfg.ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	cp := &ControlPlane{cfg: cfg}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	pki := filepath.Join(cfg.Dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, err
	}
	token, err := cp.writeCredentials(pki)
	if err != nil {
		return nil, err
	}

	etcdClient, err := freePort(netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		return nil, err
	}
	etcdPeer, err := freePort(netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	etcd, err := StartProcess(ctx, "etcd", cfg.Binaries.Etcd, []string{
		"--data-dir=" + filepath.Join(cfg.Dir, "etcd"),
		"--name=dpconform",
		"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=dpconform=" + peerURL,
		// The data is thrown away with the run: durability only costs start-up time.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}, cfg.Env, filepath.Join(cfg.Dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, etcd)

	port, err := freePort(cfg.BindIP)
	if err != nil {
		return nil, err
	}
	apiserver, err := StartProcess(ctx, "kube-apiserver", cfg.Binaries.APIServer, []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + cfg.BindIP.String(),
		"--advertise-address=" + cfg.BindIP.String(),
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
		"--token-auth-file=" + filepath.Join(pki, "tokens.csv"),
		"--anonymous-auth=false",
		"--authorization-mode=AlwaysAllow",
		"--service-cluster-ip-range=" + cfg.ServiceCIDR.String(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		// No kubelet and no service-account controller run here: the suite writes Pod
		// status itself, and pods need no service-account tokens.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=0",
	}, cfg.Env, filepath.Join(cfg.Dir, "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, apiserver)

	ca, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		return nil, err
	}
	server := "https://" + net.JoinHostPort(cfg.BindIP.String(), strconv.Itoa(port))
	cp.restConfig = &rest.Config{
		Host:            server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		QPS:             500,
		Burst:           1000,
		UserAgent:       "dpconform",
	}
	if cp.kube, err = kubernetes.NewForConfig(cp.restConfig); err != nil {
		return nil, err
	}
	cp.kubeconfig = filepath.Join(cfg.Dir, "kubeconfig")
	if err := writeKubeconfig(cp.kubeconfig, server, ca, token); err != nil {
		return nil, err
	}
	if err := cp.waitReady(ctx, apiserver, etcd); err != nil {
		return nil, err
	}

	kcm, err := StartProcess(ctx, "kube-controller-manager", cfg.Binaries.ControllerManager, []string{
		"--kubeconfig=" + cp.kubeconfig,
		"--controllers=endpointslice-controller,endpointslice-mirroring-controller",
		"--leader-elect=false",
		"--secure-port=0",
		"--v=0",
	}, cfg.Env, filepath.Join(cfg.Dir, "kube-controller-manager.log"))
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, kcm)
	return cp, nil
}

// Kube is a client with full access.
func (cp *ControlPlane) Kube() kubernetes.Interface { return cp.kube }

// RESTConfig is the configuration behind Kube.
func (cp *ControlPlane) RESTConfig() *rest.Config { return rest.CopyConfig(cp.restConfig) }

// Kubeconfig is the path of a kubeconfig file for the API server, usable from any
// network namespace that reaches BindIP.
func (cp *ControlPlane) Kubeconfig() string { return cp.kubeconfig }

// Stop stops the processes in reverse start order and returns their errors.
//
// kube-apiserver is killed rather than asked to stop: on SIGTERM it drains for 1.1 s
// (measured on v1.37.2 with nothing connected), it keeps no state of its own, and the
// store behind it is thrown away with the control plane. Over a self-test of a
// hundred control planes that drain would cost two minutes.
func (cp *ControlPlane) Stop() error {
	var errs []error
	for i := len(cp.procs) - 1; i >= 0; i-- {
		grace := 10 * time.Second
		if cp.procs[i].Name == "kube-apiserver" {
			grace = 0
		}
		errs = append(errs, cp.procs[i].Stop(grace))
	}
	cp.procs = nil
	return errors.Join(errs...)
}

// notAwaited is the one readiness check of kube-apiserver that Start does not wait
// for: the built-in PriorityClasses (system-node-critical and the like), which it
// writes last, about 0.6 s after everything else. No pod a run creates names a
// priority class, and no implementation is run as a pod, so nothing depends on them;
// over a self-test of a hundred fresh control planes the wait costs a minute.
const notAwaited = "poststarthook/scheduling/bootstrap-system-priority-classes"

func (cp *ControlPlane) waitReady(ctx context.Context, procs ...*Process) error {
	ctx, cancel := context.WithTimeout(ctx, cp.cfg.ReadyTimeout)
	defer cancel()
	var last error
	for {
		for _, p := range procs {
			if p.Exited() {
				return fmt.Errorf("%s exited while waiting for the API server: %w\n%s", p.Name, p.Err(), p.LogTail(20))
			}
		}
		body, err := cp.kube.Discovery().RESTClient().Get().AbsPath("/readyz").Param("exclude", notAwaited).DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after %s (last: %v): %w\n%s", cp.cfg.ReadyTimeout, last, ctx.Err(), procs[0].LogTail(20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeCredentials writes a CA-signed serving certificate, a service-account key and a
// token file with one administrator token, and returns the token.
func (cp *ControlPlane) writeCredentials(pki string) (string, error) {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(cp.cfg.BindIP.String(), []net.IP{cp.cfg.BindIP.AsSlice(), net.IPv4(127, 0, 0, 1)}, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return "", fmt.Errorf("generate serving certificate: %w", err)
	}
	// certPEM holds the serving certificate followed by the CA that signed it.
	block, rest := pem.Decode(certPEM)
	if block == nil || len(rest) == 0 {
		return "", errors.New("generate serving certificate: no CA in the generated chain")
	}
	saKey, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return "", fmt.Errorf("generate service-account key: %w", err)
	}
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return "", err
	}
	token := hex.EncodeToString(tok[:])
	for name, data := range map[string][]byte{
		"apiserver.crt": certPEM,
		"apiserver.key": keyPEM,
		"ca.crt":        rest,
		"sa.key":        saKey,
		"tokens.csv":    []byte(token + ",dpconform-admin,dpconform-admin,\"system:masters\"\n"),
	} {
		if err := os.WriteFile(filepath.Join(pki, name), data, 0o600); err != nil {
			return "", err
		}
	}
	return token, nil
}

func writeKubeconfig(path, server string, ca []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["dpconform"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["dpconform-admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["dpconform"] = &clientcmdapi.Context{Cluster: "dpconform", AuthInfo: "dpconform-admin"}
	cfg.CurrentContext = "dpconform"
	return clientcmd.WriteToFile(*cfg, path)
}

// freePort asks the kernel for a free TCP port on ip. Another process could take it
// before the caller binds it; StartProcess's caller then sees that process fail with
// "address already in use" in its log.
func freePort(ip netip.Addr) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", ip, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
