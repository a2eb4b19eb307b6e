// Package probe is the suite's measuring instrument on the wire: small traffic
// programs that run inside a pod's or an external client's network namespace and
// stream what they observe as JSON lines, each stamped with their host's
// CLOCK_MONOTONIC. Every network namespace of a machine shares it, so on one machine
// their events line up with the suite's own transition events on one timeline; a
// host of another clock (another machine, a time namespace) is measured with the
// "clock" command (Process.ReadClock, package clocks), and Options.Clock converts its
// times as they arrive.
//
// # Roles
//
//   - serve: TCP and UDP echo servers answering with their name (the pod's name), so
//     clients know which backend answered; they report every UDP datagram (and, with
//     RecordTCP, every TCP request) they receive, for one-way and "delivered?" checks.
//   - connect: a new TCP connection every interval (default 2 ms), one request and
//     reply each, then close. Attempts run concurrently (bounded by MaxInFlight), so a
//     slow one never stalls the schedule; each is stamped when it starts.
//   - stream: K long-lived TCP connections exchanging a sequence-numbered message every
//     interval (default 5 ms). Echoes are summarised per report period; every gap
//     over the gap threshold, and every end of a stream, is its own event.
//   - udp: sequence-numbered datagrams sent round-robin to several destinations (S and
//     D alternately), one per interval (default 1 ms), from the first packet possible,
//     on one socket (one 5-tuple per destination) or each from a new one. With
//     Replies it reports every answer that comes back, and who sent it: the server
//     that answered, and from which address (a Service's frontend, or not).
//   - reach: one row of a connectivity matrix (a NetworkPolicy truth table): each of
//     many labelled targets tried once, up to ReachParallel at a time, one "reach"
//     event per target, then the probe exits by itself. TCP: one connection, request
//     and reply; UDP: a request datagram from a new socket, tried again from another
//     only on a timeout (Tries, default 3). Each try has Timeout (default 500 ms).
//
// # Outcomes
//
// A RST in answer to a SYN surfaces on Linux as ECONNREFUSED and is reported as
// Refused; a RST on an established connection (ECONNRESET, or EPIPE on a later write)
// as Reset. IsResetOrRefused groups both; for UDP (reach) an ICMP port unreachable
// is Refused too, though Linux rate-limits those per peer, so a closed UDP port may
// also show as a Timeout. A missing answer within the attempt's
// timeout is Timeout, and so is a reply that arrives after it (a SYN dropped once is
// retransmitted after 1 s, so with the default 1 s timeout it is always a timeout).
// A stream whose peer closes (FIN) keeps writing: the next write draws a RST when the
// peer's socket is gone (Reset, "... after the peer's FIN"); if none comes within 1 s,
// the stream is Closed.
//
// # The JSON line schema
//
// Every line is one Event (see its fields and the Kind constants), with short keys:
//
//	t     CLOCK_MONOTONIC ns: when the attempt started (or the event happened)
//	k     kind: ready attempt open echo gap end sent reply recv reach mark error done (exit)
//	p     probe name (in "ready"; the suite's Process sets it on every event)
//	role  pid  seq  s (stream, from 1)  o (outcome)  lat (ns)  t1 (end, ns)  n (count)
//	gap (ns)  gt (gap start)  b (backend that answered)  dst (target address or label)
//	peer (source address seen; reach: the one it used)  from (sender probe)  proto  err
//	label (reach: the target's label)
//
// For example:
//
//	{"t":1091112605590,"k":"ready","p":"ext","role":"connect","pid":29703,"dst":"10.0.0.1:30080"}
//	{"t":1091112681572,"k":"attempt","seq":1,"o":"ok","lat":1185984,"b":"pod-a","dst":"10.0.0.1:30080"}
//	{"t":1091618901251,"k":"attempt","seq":2,"o":"refused","lat":708488,"dst":"10.0.0.1:30080","err":"connect: connection refused (RST or ICMP port unreachable)"}
//	{"t":1084879605921,"k":"echo","seq":20,"s":1,"t1":1084975336949,"n":20,"gap":5719144,"gt":1084900207041,"b":"pod-a"}
//	{"t":1085182815389,"k":"reply","seq":1,"o":"ok","lat":412301,"t1":1085183227690,"b":"pod-s","dst":"S","peer":"10.96.0.10:80"}
//	{"t":1085182815389,"k":"recv","seq":1,"t1":1085182995387,"b":"pod-s","dst":"S","peer":"10.0.0.9:60166","from":"p","proto":"udp"}
//	{"t":1085201114530,"k":"reach","seq":2,"o":"ok","lat":412301,"n":1,"b":"b","dst":"10.99.0.2:80","label":"y/b TCP/80","peer":"10.99.0.1:41236","proto":"tcp"}
//	{"t":1085201114872,"k":"reach","seq":3,"o":"timeout","lat":500093412,"n":3,"dst":"10.99.0.3:81","label":"y/c UDP/81","peer":"10.99.0.1:50611","proto":"udp","err":"reply: no answer before the deadline"}
//	{"t":1085250000000,"k":"mark"}
//	{"t":1085260000000,"k":"done","n":2431}
//
// A "mark" is a watermark: everything the probe observed before its time has been
// written. Decoder reads the lines back.
//
// # Control
//
// A probe reads commands on stdin: "stop" (or the end of stdin, or SIGTERM) stops it
// cleanly: no new attempts, those in flight finish, a "done" event, exit 0 (a reach
// probe reports the targets it has not tried as skipped). "mark"
// asks for a watermark now. "clock" is answered at once, ahead of the batched events,
// with a "clock" event: the host's CLOCK_MONOTONIC when the command was read. Because the end of stdin stops it, a probe also ends when
// the suite that started it dies.
//
// # Running probes
//
// The suite starts a probe with Start, through a Starter that puts the process in the
// right network namespace (topology hosts implement it; NetNS is one for a bound
// namespace path), and gets a Process that delivers events to a callback (a
// timeline.Timeline's Add), can Stop, Kill and WaitMark, and turns a missing binary or
// a crash into an error carrying the probe's stderr.
//
// The program is either the project's binary, whose main dispatches
//
//	case "probe":
//		os.Exit(probe.Main(os.Args[2:]))   // dpconform probe <role> [flags]
//
// (Binary(path)), or the running test binary (Self()), whose TestMain calls
// RunIfChild first.
package probe
