package fuzz

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// The spare address is added at 2 s and removed at 6 s, added at 10 s while node-a's
// agent is down (9.5 s to 11 s), and removed at 13 s; the budget is 1 s, an
// attempt's timeout 200 ms.
var addressChanges = []timeline.Transition{
	{Time: at(2000), Name: EventAddressAdded, Detail: "10.0.0.200"},
	{Time: at(6000), Name: EventAddressRemoved, Detail: "10.0.0.200"},
	{Time: at(9500), Name: timeline.StopSent, Detail: "node-a"},
	{Time: at(10000), Name: EventAddressAdded, Detail: "10.0.0.200"},
	{Time: at(11000), Name: timeline.Ready, Detail: "node-a"},
	{Time: at(13000), Name: EventAddressRemoved, Detail: "10.0.0.200"},
}

func newAddressModel() *addressModel {
	return &addressModel{tl: func() []timeline.Transition { return addressChanges }, budget: time.Second, timeout: 200 * time.Millisecond, node: "node-a"}
}

// The model holds the address served from its budget after it is added and not from
// its budget after it is removed; an addition while the agent is down is due its
// budget after the agent is ready; an attempt a change meets is not judged.
func TestAddressModel(t *testing.T) {
	g := NewWithT(t)
	m := newAddressModel()
	for _, c := range []struct {
		ms             int
		served, judged bool
	}{
		{500, false, true},   // never added
		{1900, false, false}, // the addition meets it
		{2500, false, false}, // added, not due yet
		{3100, true, true},
		{5900, false, false}, // the removal meets it
		{6500, false, false}, // removed, not due yet
		{7100, false, true},
		{10500, false, false}, // added while down: due at 12 s
		{11900, false, false},
		{12100, true, true},
		{14100, false, true},
	} {
		served, judged, _ := m.verdict(at(c.ms))
		g.Expect([]bool{served, judged}).To(Equal([]bool{c.served, c.judged}), "at %d ms", c.ms)
	}
}

// spareAttempts is a window from 1 s to 15 s of attempts every 10 ms from 500 ms to
// 15.5 s on the spare address, answered while answer says so.
func spareAttempts(answer func(ms int) bool) timeline.Window {
	tl := timeline.New()
	for _, tr := range addressChanges {
		tl.RecordAt(tr.Time, tr.Name, tr.Detail)
	}
	tl.Add(probe.Event{Time: at(400), Kind: probe.KindReady, Probe: addressProbe, Role: probe.RoleConnect})
	seq := uint64(0)
	for ms := 500; ms < 15500; ms += 10 {
		seq++
		e := probe.Event{Time: at(ms), Kind: probe.KindAttempt, Probe: addressProbe, Seq: seq, Outcome: probe.Timeout, Target: "10.0.0.200:30080"}
		if answer(ms) {
			e.Outcome, e.Backend = probe.OK, addressService
		}
		tl.Add(e)
	}
	tl.Add(probe.Event{Time: at(15500), Kind: probe.KindMark, Probe: addressProbe})
	return tl.Window(at(1000), at(15000))
}

func TestAddressAsModelled(t *testing.T) {
	g := NewWithT(t)
	asAdded := func(ms int) bool { return (ms >= 2500 && ms < 6500) || (ms >= 11500 && ms < 13500) }
	m := newAddressAsModelled(newAddressModel())
	ok, err := m.Match(spareAttempts(asAdded))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeTrue(), "served within the budgets: %s", m.FailureMessage(nil))

	// Host addresses read once: what is added later is never served.
	ok, err = m.Match(spareAttempts(func(int) bool { return false }))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse())
	res := m.Result()
	g.Expect(res.Kind).To(Equal(matchers.KindTimeout))
	g.Expect(m.FailureMessage(nil)).To(ContainSubstring("attempt #251 to 10.0.0.200:30080 was due to be served (added 1s before) but not answered"))

	// Removals ignored: the address is served after its removal's budget.
	ok, err = m.Match(spareAttempts(func(ms int) bool { return asAdded(ms) || (ms >= 6500 && ms < 9000) }))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse())
	res = m.Result()
	g.Expect(res.Kind).To(Equal(matchers.KindDelivered))
	g.Expect(res.Figures[0].Value).To(BeEquivalentTo(200))
	msg := m.FailureMessage(nil)
	t.Logf("%s", msg)
	g.Expect(msg).To(ContainSubstring("was due not to be served (removed 1s before) but answered by " + addressService))
	g.Expect(msg).To(ContainSubstring("<=="))

	// No attempt at all: the round cannot judge the address.
	empty := timeline.New().Window(at(1000), at(2000))
	_, err = m.Match(empty)
	g.Expect(err).To(MatchError(matchers.ErrInstrument))
}
