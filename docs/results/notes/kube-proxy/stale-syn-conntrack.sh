#!/bin/bash
# Run as root: builds two network namespaces of its own (ctexp-c, ctexp-n) and removes them.
# Evidence for docs/kube-proxy.md (5.): why NODE-ADDRESS-CHANGE may fail with a reset
# against kube-proxy's iptables mode.
# A SYN forwarded through a node before an address is local there leaves an
# unreplied conntrack entry with no NAT; once the address is added, a SYN of the
# same tuple follows that entry (no DNAT) and is refused; a new tuple is DNATed.
set -e
C=ctexp-c; N=ctexp-n
cleanup() { ip netns del $C 2>/dev/null || true; ip netns del $N 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add $C; ip netns add $N
ip link add ce netns $C type veth peer name ne netns $N
ip -n $C addr add 10.250.0.100/24 dev ce; ip -n $C link set ce up; ip -n $C link set lo up
ip -n $N addr add 10.250.0.10/24 dev ne; ip -n $N link set ne up; ip -n $N link set lo up
ip netns exec $N sysctl -qw net.ipv4.ip_forward=1
# The client's neighbour entry for the spare address is node N's MAC.
mac=$(ip -n $N -br link show ne | awk '{print $3}')
ip -n $C neigh replace 10.250.0.200 lladdr $mac dev ce nud permanent
# kube-proxy's NodePort jump, iptables mode with nodePortAddresses unset: addrtype LOCAL.
ip netns exec $N iptables -t nat -A PREROUTING -p tcp --dport 32450 -m addrtype --dst-type LOCAL -j REDIRECT --to-ports 8080
ip netns exec $N python3 -c '
import socket,threading
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(("0.0.0.0",8080)); s.listen(64)
while True:
    c,_=s.accept(); c.close()' &
sleep 0.3
conn() { ip netns exec $C python3 -c "
import socket,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(('10.250.0.100',$1)); s.settimeout(0.5)
try:
    s.connect(('10.250.0.200',32450)); print('port $1: connected')
except Exception as e: print('port $1:', e)"; }
echo "before the address is added:"; conn 40000
ip netns exec $N conntrack -L -d 10.250.0.200 2>/dev/null | sed 's/^/  conntrack: /'
ip -n $N addr add 10.250.0.200/24 dev ne
echo "after it is added:"; conn 40000; conn 40001
ip netns exec $N conntrack -L -d 10.250.0.200 2>/dev/null | sed 's/^/  conntrack: /'
kill %1 2>/dev/null || true
