"""The local cluster's address plan: one home for each range, read by every component that needs it.

The workplace's network rule (shared/docs/real-node-notes.md): pods and Services use 198.18.0.0/15
only (never 10/8, 172.16/12 or 192.168/16: a packet to a private address that is not on this machine
leaves it), and an egress guard drops anything from or to that range leaving by an interface other
than the bridge or loopback. The range is cut in two halves:

- `NETWORK` 198.18.0.0/15: all pods and Services use; the egress guard (node.py) and each pod's only
  route (CNI) read it.
- `POD_NETWORK` 198.18.0.0/16: the real nodes' pods (kube-proxy's clusterCIDR); node i's pods take its
  i-th /18 (`node_pod_cidr`), on node i's bridge, whose address (`node_ip`, the range's first) is the
  node's own: its kubelet, kube-proxy and the pods' gateway. Node 0 lives in the host's network
  namespace; node i >= 1 in a namespace of its own, joined to the host by a point-to-point link from
  `NODE_LINKS` (`node_link`; the host routes node i's pods over it).
- `BRIDGE_IP` 198.18.0.1: node 0's address, the host's: the apiserver (with a real node) and CoreDNS
  (every kubelet's clusterDNS; the cluster has no DNS Service) listen there.
- `SERVICE_CIDR` 198.19.0.0/16: Service ClusterIPs; kube-apiserver's --service-cluster-ip-range, and
  its first address, the `kubernetes` Service's, in the apiserver's serving certificate.
- `FAKE_POD_CIDR` 127.65.0.0/16 and `FAKE_NODE_IP`: kwok's fake pods and nodes, on loopback (a dial to
  one is refused on this machine); kwok's --cidr and --node-ip.

The ranges are sized for `JOBS` ToolRLJobs at once (the operator's benchmark): each job has
`SERVICES_PER_JOB` Services (its tool pool's, KubeRay's Ray head's) and up to `FAKE_PODS_PER_JOB` pods
on the fake nodes. The /24 Service range it had (254 addresses) ran full in a 1000-job burst (issue 37). The
controller-manager allocates no node pod CIDRs (`--allocate-node-cidrs` is off): a fake node with a
podCIDR would make kwok give its pods addresses from it, off loopback.
"""

from __future__ import annotations

import ipaddress

NETWORK = "198.18.0.0/15"
POD_NETWORK = "198.18.0.0/16"
NODE_POD_PREFIX = 18  # each real node's pod range: a /18 of POD_NETWORK
MAX_REAL_NODES = 3  # the first three /18s; the fourth holds NODE_LINKS
NODE_LINKS = "198.18.255.0/24"
BRIDGE_IP = "198.18.0.1"  # node_ip(0); a unit test checks they agree
SERVICE_CIDR = "198.19.0.0/16"
FAKE_POD_CIDR = "127.65.0.0/16"
FAKE_NODE_IP = "127.0.0.1"

JOBS = 2000  # the jobs the ranges must hold at once
SERVICES_PER_JOB = 2  # the tool pool's Service, KubeRay's head Service
# Ray head, Ray worker, KubeRay's submitter, the tool pool at its CPU examples' and the bench's
# largest size (the default example's 64-replica max would need 67; the bench's jobs stay small)
FAKE_PODS_PER_JOB = 8


def kubernetes_service_ip() -> str:
    """The `kubernetes` Service's ClusterIP: the first address of the Service range (the apiserver's
    serving certificate names it)."""
    return str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))


def node_pod_cidr(index: int) -> str:
    """Real node `index`'s pod range (its bridge's subnet, CNI host-local's)."""
    if not 0 <= index < MAX_REAL_NODES:
        raise ValueError(f"real node {index}: the address plan holds nodes 0-{MAX_REAL_NODES - 1}")
    return str(list(ipaddress.ip_network(POD_NETWORK).subnets(new_prefix=NODE_POD_PREFIX))[index])


def node_ip(index: int) -> str:
    """Real node `index`'s address: its bridge's, the first of its pod range."""
    return str(ipaddress.ip_network(node_pod_cidr(index)).network_address + 1)


def node_link(index: int) -> tuple[str, str]:
    """The host's and node `index`'s (>= 1) ends of their point-to-point link, each with the /30's prefix."""
    if not 1 <= index < MAX_REAL_NODES:
        raise ValueError(f"real node {index} has no link: node 0 is the host's own namespace")
    base = ipaddress.ip_network(NODE_LINKS).network_address + 4 * index
    return f"{base + 1}/30", f"{base + 2}/30"


def node_pod_range_start(index: int = 0) -> str:
    """The first address CNI hands a pod on real node `index` (the first few are left for the node)."""
    return str(ipaddress.ip_network(node_pod_cidr(index)).network_address + 10)


def bridge_address(index: int = 0) -> str:
    """Node `index`'s bridge address with its pod range's prefix (`ip addr add`): the node's namespace
    routes that range to the bridge."""
    return f"{node_ip(index)}/{NODE_POD_PREFIX}"


def usable(cidr: str) -> int:
    """Addresses in `cidr` that can be handed out (less its network and broadcast addresses)."""
    return ipaddress.ip_network(cidr).num_addresses - 2
