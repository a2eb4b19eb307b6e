package main

import (
	"context"
	"fmt"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpconform/dpconform/driver/crds"
)

// registerCRDs creates Cilium's CustomResourceDefinitions from the YAML files in dir
// (the module's pkg/k8s/apis/cilium.io/client/crds, which `make cilium` copies) unless
// they exist, and waits until the API server serves each. In a Cilium installation
// the operator registers them; the agent only waits for them. With IPAM from the
// Node's podCIDR and identities in CRDs, nothing else of the operator is needed for a
// run (it would garbage-collect identities, which a run does not live long enough to
// need).
func registerCRDs(ctx context.Context, kubeconfig, dir string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := crds.Ensure(ctx, client, dir); err != nil {
		return fmt.Errorf("%w (run `make cilium` for Cilium's CRDs)", err)
	}
	return nil
}
