"""The local cluster's address plan: one home for each range, read by every component that needs it.

The workplace's network rule (shared/docs/real-node-notes.md): pods and Services use 198.18.0.0/15
only (never 10/8, 172.16/12 or 192.168/16: a packet to a private address that is not on this machine
leaves it), and an egress guard drops anything from or to that range leaving by an interface other
than the bridge or loopback. The range is cut in two halves:

- `NETWORK` 198.18.0.0/15: all pods and Services use; the egress guard (node.py) and each pod's only
  route (CNI) read it.
- `NODE_POD_CIDR` 198.18.0.0/16: the real node's pods, on the bridge; CNI host-local's subnet, the
  bridge's address (the host routes the range to the bridge), kube-proxy's clusterCIDR.
- `BRIDGE_IP` 198.18.0.1: the host on the bridge, where the apiserver (with a real node), kubelet and
  CoreDNS (kubelet's clusterDNS; the cluster has no DNS Service) listen.
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
NODE_POD_CIDR = "198.18.0.0/16"
BRIDGE_IP = "198.18.0.1"
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


def node_pod_range_start() -> str:
    """The first address CNI hands a pod on the real node (the first few are left for the host)."""
    return str(ipaddress.ip_network(NODE_POD_CIDR).network_address + 10)


def bridge_address() -> str:
    """The bridge's address with the node pod range's prefix (`ip addr add`): the host routes that
    range to the bridge."""
    return f"{BRIDGE_IP}/{ipaddress.ip_network(NODE_POD_CIDR).prefixlen}"


def usable(cidr: str) -> int:
    """Addresses in `cidr` that can be handed out (less its network and broadcast addresses)."""
    return ipaddress.ip_network(cidr).num_addresses - 2
