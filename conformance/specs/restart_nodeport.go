package specs

import (
	"context"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
)

// restartNodePort is the body of RESTART-NODEPORT-NEW and -CRASH: the external client
// opens a new TCP connection to node-a's NodePort every ConnectInterval, for a Service
// with a local and one with a remote backend, while node-a's agent restarts. Every
// attempt must succeed and reach the right backend, from Lead before the stop to
// Settle after ready.
func restartNodePort(crash bool) func(context.Context, *conformance.Env) error {
	return func(ctx context.Context, e *conformance.Env) error {
		f, err := deploy(ctx, e)
		if err != nil {
			return err
		}
		b := e.Budgets
		variants := []struct {
			probe   string
			svc     service
			backend string
		}{
			{"nodeport-local", f.svcLocal, f.local.Name()},
			{"nodeport-remote", f.svcRemote, f.remote.Name()},
		}
		for _, v := range variants {
			cfg := probe.Connect{Name: v.probe, Target: v.svc.nodePortAddr(f.nodeA), Interval: b.ConnectInterval, Timeout: b.AttemptTimeout}
			if _, err := e.World.StartProbe(ctx, e.Topo.External(), cfg); err != nil {
				return conformance.Environmentf("%v", err)
			}
		}
		steady, err := e.SteadyState(ctx)
		if err != nil {
			return err
		}
		for _, v := range variants {
			if err := e.Precondition("new connections reach "+v.backend+" through node-a's NodePort before the restart", steady,
				matchers.HaveNoFailedAttempts(matchers.Probes(v.probe), matchers.Backends(v.backend))); err != nil {
				return err
			}
		}
		win, err := e.Transition(ctx, func(ctx context.Context) error { return restart(ctx, e, f.nodeA, crash) })
		if err != nil {
			return err
		}
		for _, v := range variants {
			if _, err := e.Check("no failed new connection to "+v.probe+" across a "+how(crash), win,
				matchers.HaveNoFailedAttempts(matchers.Probes(v.probe), matchers.Backends(v.backend))); err != nil {
				return err
			}
		}
		return nil
	}
}
