"""The syncer's outer optimizer: SGD with Nesterov momentum, one state per fragment.

Why: Decoupled DiLoCo (like DiLoCo) treats the merged learner delta
(Θ_prev - θ_learner) as an outer gradient and applies it with Nesterov SGD.
The syncer owns one momentum buffer per fragment tensor and updates the global
fragment in place. Update (the PyTorch / optax convention, also DiLoCo's):

    buf <- μ·buf + g
    Θ   <- Θ - lr·(g + μ·buf)      (nesterov)
    Θ   <- Θ - lr·buf              (plain momentum)

Defaults lr=0.7, μ=0.9 are DiLoCo's; the Decoupled DiLoCo paper publishes none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from diloco_chaos.trainers import mutations


@dataclass(frozen=True)
class OuterOptConfig:
    """Hyperparameters of the outer SGD."""

    lr: float = 0.7
    """Outer learning rate."""
    momentum: float = 0.9
    """Momentum coefficient μ, in [0, 1)."""
    nesterov: bool = True
    """Use the Nesterov look-ahead (g + μ·buf) instead of plain heavy-ball momentum (buf)."""

    def __post_init__(self) -> None:
        if self.lr < 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")


class NesterovOuterOptimizer:
    """Outer SGD(+Nesterov) over named tensors, with momentum keyed by (fragment key, name)."""

    def __init__(self, cfg: OuterOptConfig) -> None:
        self.cfg = cfg
        self._bufs: dict[str, dict[str, Tensor]] = {}

    def step(self, key: str, params: dict[str, Tensor], grad: Mapping[str, Tensor]) -> float:
        """Apply one outer step to `params` in place, for every tensor named in `grad`.

        Returns the step's effective learning rate, measured on the tensors: the norm of the change applied
        to the parameters over the norm of the direction (g + mu buf with Nesterov, buf without), over every
        tensor of the step (nan when the direction is 0). It equals cfg.lr up to rounding; the syncer logs it
        with the merge and the `outer_lr` invariant checks it.

        Args:
            key: fragment id (e.g. "frag3"); buffers of different keys are independent.
            params: the global fragment, name -> tensor, updated in place.
            grad: the outer gradient, name -> tensor of the same shape.

        Raises:
            ValueError: if `grad` names a tensor absent from `params` or shapes differ.
        """
        for name, g in grad.items():
            if name not in params:
                raise ValueError(f"{key}: gradient for unknown tensor {name!r}")
            if g.shape != params[name].shape:
                raise ValueError(
                    f"{key}/{name}: gradient shape {tuple(g.shape)} != param shape "
                    f"{tuple(params[name].shape)}"
                )
        lr, mu = self.cfg.lr, self.cfg.momentum
        if mutations.active("outer_lr_halved"):  # mutation: the outer step takes half the configured lr
            lr = lr / 2
        bufs = self._bufs.setdefault(key, {})
        applied_sq, direction_sq = 0.0, 0.0
        with torch.no_grad():
            for name, g in grad.items():
                p = params[name]
                gg = g.to(device=p.device, dtype=p.dtype)
                buf = bufs.get(name)
                if buf is None:
                    buf = torch.zeros_like(p)
                    bufs[name] = buf
                buf.mul_(mu).add_(gg)
                before = p.double()
                direction = gg.add(buf, alpha=mu) if self.cfg.nesterov else buf
                p.sub_(direction, alpha=lr)
                applied_sq += float(((before - p.double()) ** 2).sum())
                direction_sq += float((direction.double() ** 2).sum())
        return (applied_sq / direction_sq) ** 0.5 if direction_sq > 0 else float("nan")

    def buffers(self, key: str) -> dict[str, torch.Tensor]:
        """Copies of one key's momentum buffers ({} before its first step): what one fragment's checkpoint
        holds, without copying every fragment's buffers as `state_dict` does."""
        return {name: buf.detach().clone() for name, buf in self._bufs.get(key, {}).items()}

    def momentum_norm(self, key: str) -> float:
        """The L2 norm of one key's momentum buffers, over all of its tensors (0.0 before its first step): what a
        merge logs before and after its step, so the `outer_lr` invariant can check that each step starts
        from the momentum the previous one left (across a syncer restore too)."""
        bufs = self._bufs.get(key, {})
        if not bufs:
            return 0.0
        return float(torch.sqrt(torch.stack([(b.double() ** 2).sum() for b in bufs.values()]).sum()))

    def state_dict(self) -> dict:
        """Momentum buffers as {"buffers": {key: {name: tensor}}} (copies; safe for torch.save)."""
        return {
            "buffers": {
                key: {name: buf.detach().clone() for name, buf in bufs.items()}
                for key, bufs in self._bufs.items()
            }
        }

    def load_state_dict(self, d: Mapping) -> None:
        """Replace all momentum buffers with copies of those in `d` (from `state_dict`)."""
        if "buffers" not in d:
            raise ValueError("outer optimizer state has no 'buffers' entry")
        self._bufs = {
            str(key): {str(name): buf.detach().clone() for name, buf in bufs.items()}
            for key, bufs in d["buffers"].items()
        }
