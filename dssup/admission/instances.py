"""Cloud machine labels that name a GPU: the fallback when no matching GPU Node is cached.

Instance types of AWS EC2 (and SageMaker's ``ml.`` names), Azure (AKS) and OCI shapes, GKE's
``cloud.google.com/gke-accelerator`` values and Karpenter's GPU name label, each mapped to the GFD
(or AMD labeller) product of dssup's one GPU table (dssup/memory/gpu_table.py; a test checks
every product is there). EC2 families whose every size has the same GPU are keyed by family.
"""

from __future__ import annotations

__all__ = ["INSTANCE_GPUS", "INSTANCE_LABELS"]

# Labels whose value names the machine; the value maps to a GFD (or AMD labeller) product of
# dssup's one GPU table (dssup/memory/gpu_table.py; a test checks every product is there). Instance types: AWS EC2, Azure (AKS), OCI shapes; accelerators: GKE.
INSTANCE_LABELS = (
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
)
INSTANCE_GPUS: dict[str, str] = {
    # AWS EC2 (https://aws.amazon.com/ec2/instance-types/ accelerated computing)
    "p3.2xlarge": "Tesla-V100-SXM2-16GB",
    "p3.8xlarge": "Tesla-V100-SXM2-16GB",
    "p3.16xlarge": "Tesla-V100-SXM2-16GB",
    "p3dn.24xlarge": "Tesla-V100-SXM2-32GB",
    "p4d.24xlarge": "NVIDIA-A100-SXM4-40GB",
    "p4de.24xlarge": "NVIDIA-A100-SXM4-80GB",
    "p5.48xlarge": "NVIDIA-H100-80GB-HBM3",
    "p5.4xlarge": "NVIDIA-H100-80GB-HBM3",
    "p5e.48xlarge": "NVIDIA-H200",
    "p5en.48xlarge": "NVIDIA-H200",
    "p6-b200.48xlarge": "NVIDIA-B200",
    "g4dn": "Tesla-T4",
    "g5": "NVIDIA-A10G",
    "g6": "NVIDIA-L4",
    "gr6": "NVIDIA-L4",
    "g6e": "NVIDIA-L40S",
    # https://aws.amazon.com/blogs/aws/announcing-amazon-ec2-g7e-instances-accelerated-by-nvidia-rtx-pro-6000-blackwell-server-edition-gpus/
    "g7e": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
    # Karpenter's GPU name label
    "t4": "Tesla-T4",
    "a10g": "NVIDIA-A10G",
    "l4": "NVIDIA-L4",
    "l40s": "NVIDIA-L40S",
    "a100": "NVIDIA-A100-SXM4-40GB",
    "h100": "NVIDIA-H100-80GB-HBM3",
    "h200": "NVIDIA-H200",
    "b200": "NVIDIA-B200",
    # GKE cloud.google.com/gke-accelerator
    "nvidia-tesla-t4": "Tesla-T4",
    "nvidia-tesla-v100": "Tesla-V100-SXM2-16GB",
    "nvidia-tesla-a100": "NVIDIA-A100-SXM4-40GB",
    "nvidia-a100-80gb": "NVIDIA-A100-SXM4-80GB",
    "nvidia-l4": "NVIDIA-L4",
    "nvidia-h100-80gb": "NVIDIA-H100-80GB-HBM3",
    "nvidia-h100-mega-80gb": "NVIDIA-H100-80GB-HBM3",
    "nvidia-h200-141gb": "NVIDIA-H200",
    "nvidia-b200": "NVIDIA-B200",
    "nvidia-gb200": "NVIDIA-GB200",
    "nvidia-rtx-pro-6000": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",  # G4 machines
    # Azure (AKS node.kubernetes.io/instance-type)
    "standard_nd96asr_v4": "NVIDIA-A100-SXM4-40GB",
    "standard_nd96amsr_a100_v4": "NVIDIA-A100-SXM4-80GB",
    "standard_nc24ads_a100_v4": "NVIDIA-A100-80GB-PCIe",
    "standard_nc48ads_a100_v4": "NVIDIA-A100-80GB-PCIe",
    "standard_nc96ads_a100_v4": "NVIDIA-A100-80GB-PCIe",
    "standard_nd96isr_h100_v5": "NVIDIA-H100-80GB-HBM3",
    "standard_nd96isr_h200_v5": "NVIDIA-H200",
    "standard_nc40ads_h100_v5": "NVIDIA-H100-NVL",
    "standard_nc80adis_h100_v5": "NVIDIA-H100-NVL",
    "standard_nc4as_t4_v3": "Tesla-T4",
    "standard_nc6s_v3": "Tesla-V100-PCIE-16GB",
    "standard_nd96is_mi300x_v5": "AMD_Instinct_MI300X_OAM",
    # OCI shapes
    "bm.gpu.a100-v2.8": "NVIDIA-A100-SXM4-80GB",
    "bm.gpu4.8": "NVIDIA-A100-SXM4-40GB",
    "bm.gpu.h100.8": "NVIDIA-H100-80GB-HBM3",
    "bm.gpu.h200.8": "NVIDIA-H200",
    "bm.gpu.b200.8": "NVIDIA-B200",
    "bm.gpu.a10.4": "NVIDIA-A10",
    "bm.gpu.l40s.4": "NVIDIA-L40S",
    "bm.gpu.mi300x.8": "AMD_Instinct_MI300X_OAM",
}
