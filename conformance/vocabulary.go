package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
)

// The steps here are what specs would otherwise write by hand: waits on the API's
// EndpointSlices, a pod's relabelling, and a wait for a streak of new connections.

// AwaitReadyEndpoints waits until the EndpointSlices of the Service svc, in the
// namespace default, list exactly the pods of these names as ready: the control plane
// has taken in a change of the Service's backends. The pods are looked up when the
// step runs, so a pod a step before it adds may be one. It waits at most the budget
// `programmed`; longer is the environment's failure, not the implementation's.
func AwaitReadyEndpoints(svc string, pods ...string) Step {
	return awaitEndpoints(svc, "as ready", false, pods)
}

// AwaitListedEndpoints is AwaitReadyEndpoints for endpoints listed at all, ready,
// serving or terminating: the EndpointSlices no longer name the others.
func AwaitListedEndpoints(svc string, pods ...string) Step {
	return awaitEndpoints(svc, "at all", true, pods)
}

func awaitEndpoints(svc, how string, listed bool, pods []string) Step {
	const ns = "default"
	name := fmt.Sprintf("wait until the EndpointSlices of %s list only %s %s", svc, strings.Join(pods, " and "), how)
	return Do(name, func(ctx context.Context, e *Env) error {
		wctx, cancel := context.WithTimeout(ctx, e.Budgets.Programmed)
		defer cancel()
		err := func() error {
			want := make([]netip.Addr, len(pods))
			for i, p := range pods {
				pod, err := e.Topo.Kube().CoreV1().Pods(ns).Get(wctx, p, metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("pod %s/%s: %w", ns, p, err)
				}
				if want[i], err = netip.ParseAddr(pod.Status.PodIP); err != nil {
					return fmt.Errorf("pod %s/%s has no address: %w", ns, p, err)
				}
			}
			return topologies.WaitForEndpointAddrs(wctx, e.Topo.Kube(), ns, svc, listed, want...)
		}()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: %w", ErrEnvironment, err)
		}
		return nil
	})
}

// Relabel records event, then replaces pod p's labels in the API, as a user who takes
// a pod out of a Service (or puts it in) does. The event's detail is the pod's name
// and the labels it sets: "spare-a app=web-local".
func Relabel(p topologies.Pod, labels map[string]string, event string) Step {
	return Do(fmt.Sprintf("relabel %s to %v", p.Name(), labels), func(ctx context.Context, e *Env) error {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		if err != nil {
			return err
		}
		detail := []string{p.Name()}
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			detail = append(detail, k+"="+labels[k])
		}
		e.Record(event, strings.Join(detail, " "))
		// A merge patch replaces the values of the keys it names: the selector's key.
		if _, err := e.Topo.Kube().CoreV1().Pods(p.Namespace()).Patch(ctx, p.Name(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("relabel pod %s/%s: %w", p.Namespace(), p.Name(), err)
		}
		return nil
	})
}

// Hold waits d, or until ctx ends: a spec's pause inside a step of its own.
func Hold(ctx context.Context, d time.Duration) error { return sleep(ctx, d) }

// Streak tells when a probe has made a number of attempts in a row, in the order they
// started (their sequence numbers), that started after the moment it is armed and
// reached one of the backends: a matcher's rule (HaveServedWithin), applied as the
// attempts are reported, which is not the order they started (a timeout is reported
// a second late). A spec passes its Observe as the probe's Traffic.Observe, arms it
// when the change it waits on is made, and waits on it with Await.
type Streak struct {
	probe    string
	backends []string
	want     int
	done     chan struct{}

	mu      sync.Mutex
	since   monotime.Time   // zero: not armed
	results map[uint64]bool // reported and not counted yet: reached a backend
	next    uint64          // the attempt to count next (0: none seen yet)
	streak  int
}

// NewStreak returns a streak of want attempts of the probe named probeName, each
// answered by one of backends.
func NewStreak(probeName string, want int, backends ...string) *Streak {
	return &Streak{probe: probeName, backends: backends, want: want, done: make(chan struct{}), results: map[uint64]bool{}}
}

// Arm starts counting from the attempts that started at t or later.
func (s *Streak) Arm(t monotime.Time) {
	s.mu.Lock()
	s.since = t
	s.mu.Unlock()
}

// Record is a step that records the event name, with detail, and arms the streak at
// its time.
func (s *Streak) Record(name, detail string) Step {
	return Do("record "+name, func(_ context.Context, e *Env) error {
		s.Arm(e.Record(name, detail))
		return nil
	})
}

// Observe counts a probe event; pass it as Traffic.Observe.
func (s *Streak) Observe(ev probe.Event) {
	if ev.Kind != probe.KindAttempt || ev.Probe != s.probe {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since == 0 || ev.Time < s.since || s.streak >= s.want {
		return
	}
	if s.next == 0 {
		s.next = ev.Seq
	}
	if ev.Seq < s.next {
		return // started before the one counting began: only a later streak counts
	}
	s.results[ev.Seq] = ev.Outcome == probe.OK && slices.Contains(s.backends, ev.Backend)
	for {
		ok, reported := s.results[s.next]
		if !reported {
			return
		}
		delete(s.results, s.next)
		s.next++
		if !ok {
			s.streak = 0
			continue
		}
		if s.streak++; s.streak == s.want {
			close(s.done)
			return
		}
	}
}

// Done is closed once the streak is complete.
func (s *Streak) Done() <-chan struct{} { return s.done }

// Await is a step that waits until the streak is complete or budget has passed,
// whichever comes first, and goes on either way: the checks judge whether it came.
func (s *Streak) Await(budget time.Duration) Step {
	name := fmt.Sprintf("wait until %d new connections in a row reach %s (at most %s)", s.want, strings.Join(s.backends, " or "), budget)
	return Do(name, func(ctx context.Context, _ *Env) error {
		t := time.NewTimer(budget)
		defer t.Stop()
		select {
		case <-s.done:
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	})
}
