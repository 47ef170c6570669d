"""Plain-PyTorch DeepSeek-style reference model, built from the memory model's own ``ModelSpec``.

Why it exists: a memory formula is only trusted once it is checked against memory that was
really allocated. These blocks (RMSNorm, MLA with q/kv compression and decoupled RoPE, GQA,
SwiGLU, MoE with shared and top-k routed experts in a capacity-padded and a dropless variant,
embedding/head, optional MTP) are sized from the same ``dssup.memory.ModelSpec`` the estimator
reads, so one config can be both estimated and run (real CPU steps or FakeTensorMode traces).
Imported only by tooling and training scripts: it needs torch.
"""

from dssup.runtime.reference.config import RunSpec
from dssup.runtime.reference.model import ReferenceModel, build_model

__all__ = ["ReferenceModel", "RunSpec", "build_model"]
