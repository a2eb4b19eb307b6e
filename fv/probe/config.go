package probe

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Role is what a probe process does.
type Role string

// The probe roles.
const (
	// RoleServe answers TCP and UDP requests with its name and records what it receives.
	RoleServe Role = "serve"
	// RoleConnect opens a new TCP connection every interval, one request each.
	RoleConnect Role = "connect"
	// RoleStream holds long-lived TCP connections that exchange a message every interval.
	RoleStream Role = "stream"
	// RoleUDP sends sequence-numbered datagrams round-robin to several destinations.
	RoleUDP Role = "udp"
	// RoleReach tries each of many targets once, all concurrently, reports one outcome
	// per target and exits: a row of a connectivity matrix.
	RoleReach Role = "reach"
	// RoleClock does nothing but answer the "clock" command: a probe of a host's
	// CLOCK_MONOTONIC, by which the suite relates that host's clock to its own.
	RoleClock Role = "clock"
)

// Defaults of the roles' settings; a zero field in a Config means its default.
const (
	DefaultReport         = 100 * time.Millisecond
	DefaultConnectEvery   = 2 * time.Millisecond
	DefaultConnectTimeout = time.Second
	DefaultStreamEvery    = 5 * time.Millisecond
	DefaultGapThreshold   = 50 * time.Millisecond
	DefaultUDPEvery       = time.Millisecond
	DefaultReachTimeout   = 500 * time.Millisecond
	DefaultReachTries     = 3
	// MinInterval is the shortest schedule a probe accepts.
	MinInterval = 100 * time.Microsecond
	// ReachParallel is how many targets a reach probe tries at once.
	ReachParallel = 64
	// MaxReachLabel bounds a reach target's label as it travels (escaped) in a request.
	MaxReachLabel = 200
)

// Config is the configuration of one probe role: Serve, Connect, Stream, UDP, Reach
// or Clock.
type Config interface {
	// Role is the role the probe runs.
	Role() Role
	// ProbeName is the probe's name: it names the probe on the timeline, travels in
	// its requests, and is the identity a server answers with.
	ProbeName() string
	// Args renders the configuration as the role's command-line flags.
	Args() []string
	// Validate reports a configuration the probe would refuse.
	Validate() error
}

// Serve configures RoleServe: echo servers that answer with Name.
type Serve struct {
	Name string
	// Address is the IP to listen on; empty means every address.
	Address string
	// TCP and UDP are the ports to serve.
	TCP, UDP []int
	// RecordTCP makes the server report every connect request and the first message
	// of every stream as a KindRecv event (UDP requests are always reported).
	RecordTCP bool
	// Report is the period of watermarks; default DefaultReport.
	Report time.Duration
}

// Connect configures RoleConnect.
type Connect struct {
	Name string
	// Target is the host:port to connect to.
	Target string
	// Label travels in each request and comes back in the server's KindRecv events.
	Label string
	// Interval between attempt starts; default DefaultConnectEvery.
	Interval time.Duration
	// Timeout of one attempt, from its start to the reply; default DefaultConnectTimeout.
	// A reply that arrives later is a timeout too.
	Timeout time.Duration
	// MaxInFlight bounds the attempts in flight; beyond it an attempt is Skipped.
	// Default Timeout/Interval + 16, enough for a complete blackhole.
	MaxInFlight int
	// Count stops the probe after this many attempts; 0 runs until stopped.
	Count int
	// Hold keeps every connection whose attempt succeeded open, silent, until the
	// probe stops; then it sends a second request on each and waits for the answer
	// (within Timeout), and reports a KindHeld event per connection: did the flow
	// survive whatever happened while it was held? Without Hold (and once the probe
	// is told to release, Process.Release) the server closes each connection after
	// its reply.
	Hold bool
	// Report is the period of watermarks; default DefaultReport.
	Report time.Duration
}

// Stream configures RoleStream.
type Stream struct {
	Name   string
	Target string
	Label  string
	// Streams is the number of connections held; default 1.
	Streams int
	// Interval between messages on each stream; default DefaultStreamEvery.
	Interval time.Duration
	// DialTimeout bounds the opening of each stream; default DefaultConnectTimeout.
	DialTimeout time.Duration
	// GapThreshold: every gap between echoes longer than this is reported as its own
	// KindGap event; default DefaultGapThreshold.
	GapThreshold time.Duration
	// Report is the period of KindEcho summaries and watermarks; default DefaultReport.
	Report time.Duration
}

// Destination is where RoleUDP sends, under a label that travels in each datagram.
type Destination struct {
	Label string
	Addr  string // ip:port
}

// UDP configures RoleUDP.
type UDP struct {
	Name string
	// To are the destinations, served round-robin: datagram seq goes to
	// To[(seq-1) % len(To)], one datagram per Interval, from the first one possible.
	To []Destination
	// Interval between datagrams; default DefaultUDPEvery.
	Interval time.Duration
	// NewSocket sends each datagram from a new socket instead of one socket for the
	// whole run: a port the kernel picks, so as a rule a new flow for the dataplane,
	// but now and then a port an earlier socket used (each sent event says which).
	NewSocket bool
	// Replies reports every answer that comes back on the socket (the serve role
	// answers each datagram) as a KindReply event: which server answered, from which
	// address. Not with NewSocket.
	Replies bool
	// Timeout is how long, with Replies, a datagram waits for its answer: a later one
	// is not reported, and the datagram counts as unanswered. Default
	// DefaultConnectTimeout.
	Timeout time.Duration
	// Count stops the probe after this many datagrams; 0 runs until stopped.
	Count int
	// Report is the period of watermarks; default DefaultReport.
	Report time.Duration
}

// Reach configures RoleReach: one attempt per target, all concurrently (at most
// ReachParallel at once), then exit.
type Reach struct {
	Name    string
	Targets []Target
	// Timeout of one try, from its start to the reply; default DefaultReachTimeout.
	// A reply that arrives later is a timeout too.
	Timeout time.Duration
	// Tries per UDP target, each from a new socket (a new flow), until one is
	// answered (a reply, or an ICMP error: only a timeout is tried again); default
	// DefaultReachTries. TCP gets one connection per target: a SYN retransmission is
	// the kernel's business.
	Tries int
}

// Clock configures RoleClock: a probe that sends no traffic and answers "clock" on
// its control channel with a reading of its host's CLOCK_MONOTONIC (every probe role
// answers it; this one is started for that alone).
type Clock struct {
	Name string
}

// Target is a cell of a connectivity matrix: where a reach probe tries, and the label
// its outcome is reported under.
type Target struct {
	// Label names the cell, e.g. "y/b TCP/80"; unique within a Reach, and it travels
	// in the request (the server reports it as the KindRecv's Target).
	Label string
	Proto string // "tcp" or "udp"
	Addr  string // ip:port
}

// Role implements Config.
func (Serve) Role() Role { return RoleServe }

// Role implements Config.
func (Connect) Role() Role { return RoleConnect }

// Role implements Config.
func (Stream) Role() Role { return RoleStream }

// Role implements Config.
func (UDP) Role() Role { return RoleUDP }

// Role implements Config.
func (Reach) Role() Role { return RoleReach }

// Role implements Config.
func (Clock) Role() Role { return RoleClock }

// ProbeName implements Config.
func (c Serve) ProbeName() string { return c.Name }

// ProbeName implements Config.
func (c Connect) ProbeName() string { return c.Name }

// ProbeName implements Config.
func (c Stream) ProbeName() string { return c.Name }

// ProbeName implements Config.
func (c UDP) ProbeName() string { return c.Name }

// ProbeName implements Config.
func (c Reach) ProbeName() string { return c.Name }

// ProbeName implements Config.
func (c Clock) ProbeName() string { return c.Name }

// bind registers the role's flags on fs, each bound to a field of the config: the
// one place a field and its flag are named. parseConfig reads a command line through
// it, and Args writes one.
type binder interface {
	bind(fs *flag.FlagSet)
}

// repeated is a flag given once per value (-to, -target).
type repeated interface {
	values() []string
}

// argsOf is the command line that parses back into the values fill gives b: a flag
// for each field that is not zero, a repeated flag once per value. (Binding a flag
// sets its field to the flag's default, so b is filled after it is bound.)
func argsOf(b binder, fill func()) []string {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	b.bind(fs)
	fill()
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if r, ok := f.Value.(repeated); ok {
			for _, v := range r.values() {
				out = append(out, "-"+f.Name+"="+v)
			}
			return
		}
		v := f.Value.String()
		switch {
		case v == f.DefValue:
		case v == "true":
			out = append(out, "-"+f.Name)
		default:
			out = append(out, "-"+f.Name+"="+v)
		}
	})
	return out
}

// Args implements Config.
func (c Serve) Args() []string {
	var b Serve
	return argsOf(&b, func() { b = c })
}

// Args implements Config.
func (c Connect) Args() []string {
	var b Connect
	return argsOf(&b, func() { b = c })
}

// Args implements Config.
func (c Stream) Args() []string {
	var b Stream
	return argsOf(&b, func() { b = c })
}

// Args implements Config.
func (c UDP) Args() []string {
	var b UDP
	return argsOf(&b, func() { b = c })
}

// Args implements Config.
func (c Reach) Args() []string {
	var b Reach
	return argsOf(&b, func() { b = c })
}

// Args implements Config.
func (c Clock) Args() []string {
	var b Clock
	return argsOf(&b, func() { b = c })
}

// The flags of each role, with zero defaults: a field left zero takes its default
// (withDefaults), whether it came from a command line or a Go value.

func (c *Clock) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "", "probe name (required)")
}

func (c *Serve) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "", "identity answered to clients (required)")
	fs.StringVar(&c.Address, "address", "", "IP to listen on (default every address)")
	fs.Var(portsFlag{&c.TCP}, "tcp", "TCP ports to serve, comma separated")
	fs.Var(portsFlag{&c.UDP}, "udp", "UDP ports to serve, comma separated")
	fs.BoolVar(&c.RecordTCP, "record-tcp", false, "report TCP requests as recv events")
	fs.DurationVar(&c.Report, "report", 0, "watermark period (default "+DefaultReport.String()+")")
}

func (c *Connect) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "", "probe name (required)")
	fs.StringVar(&c.Target, "target", "", "host:port to connect to (required)")
	fs.StringVar(&c.Label, "label", "", "label carried in requests")
	fs.DurationVar(&c.Interval, "interval", 0, "interval between attempt starts (default "+DefaultConnectEvery.String()+")")
	fs.DurationVar(&c.Timeout, "timeout", 0, "timeout of one attempt (default "+DefaultConnectTimeout.String()+")")
	fs.IntVar(&c.MaxInFlight, "max-inflight", 0, "attempts in flight at most (default timeout/interval+16)")
	fs.IntVar(&c.Count, "count", 0, "stop after this many attempts (0: until stopped)")
	fs.BoolVar(&c.Hold, "hold", false, "keep each connection open until the probe stops, then check that it still answers")
	fs.DurationVar(&c.Report, "report", 0, "watermark period (default "+DefaultReport.String()+")")
}

func (c *Stream) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "", "probe name (required)")
	fs.StringVar(&c.Target, "target", "", "host:port to connect to (required)")
	fs.StringVar(&c.Label, "label", "", "label carried in requests")
	fs.IntVar(&c.Streams, "streams", 0, "number of streams (default 1)")
	fs.DurationVar(&c.Interval, "interval", 0, "interval between messages on a stream (default "+DefaultStreamEvery.String()+")")
	fs.DurationVar(&c.DialTimeout, "dial-timeout", 0, "timeout to open a stream (default "+DefaultConnectTimeout.String()+")")
	fs.DurationVar(&c.GapThreshold, "gap-threshold", 0, "report every gap longer than this (default "+DefaultGapThreshold.String()+")")
	fs.DurationVar(&c.Report, "report", 0, "period of echo summaries and watermarks (default "+DefaultReport.String()+")")
}

func (c *UDP) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "", "probe name (required)")
	fs.Var(destFlag{&c.To}, "to", "destination label=ip:port (repeatable, served round-robin)")
	fs.DurationVar(&c.Interval, "interval", 0, "interval between datagrams (default "+DefaultUDPEvery.String()+")")
	fs.BoolVar(&c.NewSocket, "new-socket", false, "a new socket (source port) for every datagram")
	fs.BoolVar(&c.Replies, "replies", false, "report the answers that come back on the socket")
	fs.DurationVar(&c.Timeout, "timeout", 0, "with -replies, how long a datagram waits for its answer (default "+DefaultConnectTimeout.String()+")")
	fs.IntVar(&c.Count, "count", 0, "stop after this many datagrams (0: until stopped)")
	fs.DurationVar(&c.Report, "report", 0, "watermark period (default "+DefaultReport.String()+")")
}

func (c *Reach) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "", "probe name (required)")
	fs.Var(targetFlag{&c.Targets}, "target", "target proto,ip:port,label (repeatable; the label takes the rest)")
	fs.DurationVar(&c.Timeout, "timeout", 0, "timeout of one try (default "+DefaultReachTimeout.String()+")")
	fs.IntVar(&c.Tries, "tries", 0, "tries per UDP target, each from a new socket (default "+strconv.Itoa(DefaultReachTries)+")")
}

// String renders t as the -target flag takes it: proto,ip:port,label. The label comes
// last and takes the rest, so it may hold anything, commas included.
func (t Target) String() string { return t.Proto + "," + t.Addr + "," + t.Label }

// String renders d as the -to flag takes it: label=ip:port.
func (d Destination) String() string {
	if d.Label == "" {
		return d.Addr
	}
	return d.Label + "=" + d.Addr
}

func joinPorts(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

func checkInterval(what string, d time.Duration) error {
	if d != 0 && d < MinInterval {
		return fmt.Errorf("%s %v is below the minimum %v", what, d, MinInterval)
	}
	if d < 0 {
		return fmt.Errorf("%s %v is negative", what, d)
	}
	return nil
}

func checkHostPort(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is required", what)
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		return fmt.Errorf("%s %q: %w", what, s, err)
	}
	return nil
}

// Validate implements Config.
func (c Serve) Validate() error {
	if err := checkToken("name", c.Name); err != nil {
		return err
	}
	if len(c.TCP)+len(c.UDP) == 0 {
		return errors.New("serve needs at least one TCP or UDP port")
	}
	for _, p := range append(append([]int{}, c.TCP...), c.UDP...) {
		if p <= 0 || p > 65535 {
			return fmt.Errorf("port %d out of range", p)
		}
	}
	if c.Address != "" && net.ParseIP(c.Address) == nil {
		return fmt.Errorf("address %q is not an IP", c.Address)
	}
	return checkInterval("report", c.Report)
}

// Validate implements Config.
func (c Connect) Validate() error {
	if err := checkToken("name", c.Name); err != nil {
		return err
	}
	if c.Label != "" {
		if err := checkToken("label", c.Label); err != nil {
			return err
		}
	}
	if err := checkHostPort("target", c.Target); err != nil {
		return err
	}
	if c.Timeout < 0 || c.MaxInFlight < 0 || c.Count < 0 {
		return errors.New("timeout, max-inflight and count must not be negative")
	}
	return errors.Join(checkInterval("interval", c.Interval), checkInterval("report", c.Report))
}

// Validate implements Config.
func (c Stream) Validate() error {
	if err := checkToken("name", c.Name); err != nil {
		return err
	}
	if c.Label != "" {
		if err := checkToken("label", c.Label); err != nil {
			return err
		}
	}
	if err := checkHostPort("target", c.Target); err != nil {
		return err
	}
	if c.Streams < 0 || c.DialTimeout < 0 || c.GapThreshold < 0 {
		return errors.New("streams, dial-timeout and gap-threshold must not be negative")
	}
	return errors.Join(checkInterval("interval", c.Interval), checkInterval("report", c.Report))
}

// Validate implements Config.
func (c UDP) Validate() error {
	if err := checkToken("name", c.Name); err != nil {
		return err
	}
	if len(c.To) == 0 {
		return errors.New("udp needs at least one destination")
	}
	for _, d := range c.To {
		if d.Label != "" {
			if err := checkToken("label", d.Label); err != nil {
				return err
			}
		}
		if err := checkHostPort("destination", d.Addr); err != nil {
			return err
		}
	}
	if c.Count < 0 || c.Timeout < 0 {
		return errors.New("count and timeout must not be negative")
	}
	if c.Replies && c.NewSocket {
		return errors.New("replies are read on the probe's one socket: not with new-socket")
	}
	return errors.Join(checkInterval("interval", c.Interval), checkInterval("report", c.Report))
}

// Validate implements Config.
func (c Reach) Validate() error {
	if err := checkToken("name", c.Name); err != nil {
		return err
	}
	if len(c.Targets) == 0 {
		return errors.New("reach needs at least one target")
	}
	seen := map[string]bool{}
	for _, t := range c.Targets {
		switch {
		case t.Label == "":
			return fmt.Errorf("target %s %s: the label must not be empty", t.Proto, t.Addr)
		case !utf8.ValidString(t.Label):
			return fmt.Errorf("target label %q is not UTF-8", t.Label)
		case len(appendLabel(nil, t.Label)) > MaxReachLabel:
			return fmt.Errorf("target label %q is longer than %d bytes on the wire", t.Label, MaxReachLabel)
		case seen[t.Label]:
			return fmt.Errorf("target label %q is used twice", t.Label)
		case t.Proto != "tcp" && t.Proto != "udp":
			return fmt.Errorf("target %q: protocol %q is not tcp or udp", t.Label, t.Proto)
		}
		seen[t.Label] = true
		if err := checkHostPort(fmt.Sprintf("target %q address", t.Label), t.Addr); err != nil {
			return err
		}
	}
	if c.Timeout < 0 || c.Tries < 0 {
		return errors.New("timeout and tries must not be negative")
	}
	return nil
}

// Validate implements Config.
func (c Clock) Validate() error {
	if c.Name == "" {
		return errors.New("name is required")
	}
	return nil
}

func (c Serve) withDefaults() Serve {
	c.Report = or(c.Report, DefaultReport)
	return c
}

func (c Connect) withDefaults() Connect {
	c.Interval = or(c.Interval, DefaultConnectEvery)
	c.Timeout = or(c.Timeout, DefaultConnectTimeout)
	c.Report = or(c.Report, DefaultReport)
	if c.MaxInFlight == 0 {
		c.MaxInFlight = int(c.Timeout/c.Interval) + 16
	}
	return c
}

func (c Stream) withDefaults() Stream {
	if c.Streams == 0 {
		c.Streams = 1
	}
	c.Interval = or(c.Interval, DefaultStreamEvery)
	c.DialTimeout = or(c.DialTimeout, DefaultConnectTimeout)
	c.GapThreshold = or(c.GapThreshold, DefaultGapThreshold)
	c.Report = or(c.Report, DefaultReport)
	return c
}

func (c UDP) withDefaults() UDP {
	c.Interval = or(c.Interval, DefaultUDPEvery)
	if c.Replies {
		c.Timeout = or(c.Timeout, DefaultConnectTimeout)
	}
	c.Report = or(c.Report, DefaultReport)
	for i := range c.To {
		if c.To[i].Label == "" {
			c.To[i].Label = c.To[i].Addr
		}
	}
	return c
}

func (c Reach) withDefaults() Reach {
	c.Timeout = or(c.Timeout, DefaultReachTimeout)
	if c.Tries == 0 {
		c.Tries = DefaultReachTries
	}
	return c
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

type portsFlag struct{ p *[]int }

func (f portsFlag) String() string {
	if f.p == nil {
		return ""
	}
	return joinPorts(*f.p)
}

func (f portsFlag) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		n, err := strconv.Atoi(part)
		if err != nil {
			return fmt.Errorf("port %q: %w", part, err)
		}
		*f.p = append(*f.p, n)
	}
	return nil
}

type destFlag struct{ d *[]Destination }

func (f destFlag) String() string { return "" }

func (f destFlag) values() []string {
	var out []string
	for _, d := range *f.d {
		out = append(out, d.String())
	}
	return out
}

func (f destFlag) Set(s string) error {
	d := Destination{Addr: s}
	if label, addr, ok := strings.Cut(s, "="); ok {
		d = Destination{Label: label, Addr: addr}
	}
	*f.d = append(*f.d, d)
	return nil
}

type targetFlag struct{ t *[]Target }

func (f targetFlag) String() string { return "" }

func (f targetFlag) values() []string {
	var out []string
	for _, t := range *f.t {
		out = append(out, t.String())
	}
	return out
}

func (f targetFlag) Set(s string) error {
	proto, rest, ok1 := strings.Cut(s, ",")
	addr, label, ok2 := strings.Cut(rest, ",")
	if !ok1 || !ok2 {
		return fmt.Errorf("target %q is not proto,ip:port,label", s)
	}
	*f.t = append(*f.t, Target{Label: label, Proto: proto, Addr: addr})
	return nil
}

// parseConfig parses a role's flags into its Config, with defaults filled in.
func parseConfig(role Role, argv []string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("probe "+string(role), flag.ContinueOnError)
	fs.SetOutput(stderr)
	var b binder
	switch role {
	case RoleServe:
		b = &Serve{}
	case RoleConnect:
		b = &Connect{}
	case RoleStream:
		b = &Stream{}
	case RoleUDP:
		b = &UDP{}
	case RoleReach:
		b = &Reach{}
	case RoleClock:
		b = &Clock{}
	default:
		return nil, fmt.Errorf("unknown role %q (serve, connect, stream, udp, reach, clock)", role)
	}
	b.bind(fs)
	if err := fs.Parse(argv); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var cfg Config
	switch c := b.(type) {
	case *Serve:
		cfg = c.withDefaults()
	case *Connect:
		cfg = c.withDefaults()
	case *Stream:
		cfg = c.withDefaults()
	case *UDP:
		cfg = c.withDefaults()
	case *Reach:
		cfg = c.withDefaults()
	case *Clock:
		cfg = *c
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("probe %s: %w", role, err)
	}
	return cfg, nil
}
