"""How much of a model is its vocabulary: the embedding and the LM head against the rest.

Small real models often carry a large vocabulary (GPT-NeoX's 50k tokens are most of a 14M-parameter Pythia):
the head's matrix-vector product is then most of a token's multiply-accumulates, and the two tables most of
the weights the chip stores.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import ModelIR


@dataclass(frozen=True)
class VocabShares:
    embed_weights: int  # token table (learned positions not counted: they grow with the context, not the vocabulary)
    head_weights: int  # 0 when tied: the head is the embedding
    weights: int  # every stored weight (ModelIR.n_params)
    head_macs: int  # the head's MACs per token: vocab x d_model
    macs: int  # every projection's MACs per token, the head included (attention's products left out)

    @property
    def weight_share(self) -> float:
        return (self.embed_weights + self.head_weights) / self.weights

    @property
    def mac_share(self) -> float:
        return self.head_macs / self.macs

    def summary(self) -> str:
        tables = f"embedding {self.embed_weights:,}" + (f" + head {self.head_weights:,}" if self.head_weights else
                                                          " (head tied)")
        return (f"{tables} of {self.weights:,} weights ({self.weight_share:.0%}); head {self.head_macs:,} of "
                f"{self.macs:,} projection MACs/token ({self.mac_share:.0%})")


def vocab_shares(ir: ModelIR) -> VocabShares:
    cfg = ir.config
    layer_macs = sum(lin.weight.size for layer in ir.layers
                     for lin in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down) if lin is not None)
    head_macs = int(ir.head.weight.size)
    return VocabShares(embed_weights=int(ir.embed.size), head_weights=0 if cfg.tied_head else head_macs,
                       weights=ir.n_params, head_macs=head_macs, macs=int(layer_macs) + head_macs)
