package skel

import (
	"context"
	"errors"
	"time"

	"github.com/dpconform/dpconform/driver"
)

// Agent is an implementation's agent process on one node, as a driver that starts it
// for the suite manages it: each call of the driver builds one afresh for its node, so
// its state lives in the node's state directory, not in the value.
type Agent interface {
	// Start starts the agent without waiting for it to be ready and returns its PID;
	// if it already runs as asked, Start returns that PID.
	Start(ctx context.Context) (pid int, err error)
	// Status says whether the agent runs and is ready; what it cannot learn is
	// "not ready", not an error.
	Status(ctx context.Context) driver.Status
	// Stop stops the agent gracefully and returns once it has exited.
	Stop(ctx context.Context) error
	// Kill crashes the agent and returns once it has exited.
	Kill(ctx context.Context) error
	// Diagnostics writes what explains a failure into dir and returns the files
	// written; an error with some files written is partial, not a failure.
	Diagnostics(ctx context.Context, dir string) (files []string, err error)
	// Cleanup kills the agent and removes everything of it from the node.
	Cleanup(ctx context.Context) error
}

// AgentFor returns the agent of node n, or an error (a Failure, as a rule) that says
// why there is none, such as a missing binary. start holds the options of a start
// call and is nil for every other verb: an agent whose process depends on them (a
// mode, say) is built for them, and one that runs is managed whatever they were.
type AgentFor func(n Node, start *driver.StartOptions) (Agent, error)

// ProcessBudgets are deadlines for the verbs of a driver that runs its agent as a
// process in the node (as the kube-proxy and kube-router drivers do), inside the
// contract's timeouts (driver.DefaultTimeouts): an agent that starts, stops and is
// inspected locally never needs more.
var ProcessBudgets = driver.Timeouts{
	Start:   20 * time.Second,
	Status:  3 * time.Second,
	Stop:    30 * time.Second,
	Kill:    5 * time.Second,
	Collect: 45 * time.Second,
	Cleanup: 45 * time.Second,
}

// AgentFuncs returns the node verbs of a driver whose implementation is one agent
// process per node: start, status, stop, kill, collect and cleanup, each with the
// agent agentFor builds for the call's node, under a deadline of its budget in
// budgets (a zero budget adds none). The caller adds Info and whatever else its
// driver has (Events, RequireNetNS, CheckNode).
//
// An agent's error becomes the verb's Failure: "start failed" (start), "agent did not
// exit" (stop, kill), "collect failed" (collect, only when no file was written) and
// "cleanup failed" (cleanup), with the error as the detail. An error that is already a
// Failure, such as "already running" from Start, is replied as it is.
func AgentFuncs(agentFor AgentFor, budgets driver.Timeouts) Funcs {
	// with runs fn with the call's agent under budget.
	with := func(ctx context.Context, n Node, start *driver.StartOptions, budget time.Duration, fn func(context.Context, Agent) error) error {
		a, err := agentFor(n, start)
		if err != nil {
			return err
		}
		if budget > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, budget)
			defer cancel()
		}
		return fn(ctx, a)
	}
	return Funcs{
		Start: func(ctx context.Context, n Node, opts driver.StartOptions) (pid int, err error) {
			err = with(ctx, n, &opts, budgets.Start, func(ctx context.Context, a Agent) error {
				pid, err = a.Start(ctx)
				return failed("start failed", err)
			})
			if err != nil {
				return 0, err
			}
			return pid, nil
		},
		Status: func(ctx context.Context, n Node) (st driver.Status, err error) {
			err = with(ctx, n, nil, budgets.Status, func(ctx context.Context, a Agent) error {
				st = a.Status(ctx)
				return nil
			})
			return st, err
		},
		Stop: func(ctx context.Context, n Node) error {
			return with(ctx, n, nil, budgets.Stop, func(ctx context.Context, a Agent) error {
				return failed("agent did not exit", a.Stop(ctx))
			})
		},
		Kill: func(ctx context.Context, n Node) error {
			return with(ctx, n, nil, budgets.Kill, func(ctx context.Context, a Agent) error {
				return failed("agent did not exit", a.Kill(ctx))
			})
		},
		Collect: func(ctx context.Context, n Node, dir string) (files []string, err error) {
			err = with(ctx, n, nil, budgets.Collect, func(ctx context.Context, a Agent) error {
				var err error
				if files, err = a.Diagnostics(ctx, dir); len(files) > 0 {
					return nil // what was written is worth more than the error
				}
				return failed("collect failed", err)
			})
			if err != nil {
				return nil, err
			}
			return files, nil
		},
		Cleanup: func(ctx context.Context, n Node) error {
			return with(ctx, n, nil, budgets.Cleanup, func(ctx context.Context, a Agent) error {
				return failed("cleanup failed", a.Cleanup(ctx))
			})
		},
	}
}

// failed makes err the Failure msg, unless it is nil or a Failure already.
func failed(msg string, err error) error {
	var f *Failure
	if err == nil || errors.As(err, &f) {
		return err
	}
	return Fail(msg, "%w", err)
}

// NetNSOnly returns a CheckNode for a driver that runs its agent only inside a node's
// network namespace (with RequireNetNS): it refuses any topology but netns as
// "unsupported topology", before skel asks for the DPC_NETNS that such a topology
// never sets, since the reason to give is the topology, not the variable. agent names
// what the driver runs; onKind says what to use on kind instead.
func NetNSOnly(agent, onKind string) func(Node) error {
	return func(n Node) error {
		if n.Topology != "" && n.Topology != "netns" {
			return Fail("unsupported topology", "DPC_TOPOLOGY=%s: this driver runs %s inside a node's network namespace (DPC_TOPOLOGY=netns); on kind, %s", n.Topology, agent, onKind)
		}
		return nil
	}
}
