"""FedFed (Yang et al., NeurIPS 2023): the feature-distillation module, its training objective, the noisy
performance-sensitive features, and the length of the distillation phase.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpers.core.training import EVAL_BATCH
from fedpers.core.schema import Key, positive, non_negative
from fedpers.core.wire import MODEL_SECTION, Contract


# What travels, by named section (fedpers.core.wire.Contract), declared once for the strategy and the client:
# broadcast = the model and a draw of the global shared dataset (empty before the training phase); upload = the
# model and the client's noisy shared features with their labels (empty but once).
CONTRACT = Contract(broadcast=(MODEL_SECTION, "shared_features", "shared_labels"),
                    upload=(MODEL_SECTION, "shared_features", "shared_labels"))

# FedFed's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedfed_distill_rounds", int, 15,
        "FedFed feature-distillation rounds (code: 15), counted inside `rounds`, at most rounds - 1 (ours)",
        non_negative),
    Key("fedfed_vae_lr", float, 0.001, "FedFed distiller Adam learning rate (code: 1e-3)", positive),
    Key("fedfed_noise_std1", float, 0.15, "FedFed std of the 1st Gaussian noise on shared features (code: 0.15)",
        non_negative),
    Key("fedfed_noise_std2", float, 0.25, "FedFed std of the 2nd Gaussian noise on shared features (code: 0.25)",
        non_negative),
    Key("fedfed_rec", float, 5.0, "FedFed weight of the distiller's reconstruction loss (code: 5.0)", non_negative),
    Key("fedfed_kl", float, 0.005, "FedFed weight of the distiller's KL term (code: 0.005)", non_negative),
    Key("fedfed_ce", float, 2.0, "FedFed weight of the CE on noisy sensitive features (code: 2.0)", non_negative),
    Key("fedfed_x_ce", float, 0.4, "FedFed weight of the CE on raw inputs while distilling (code: 0.4)",
        non_negative),
)


class FeatureDistiller(nn.Module):
    """FedFed's feature-distillation module: a small convolutional VAE whose reconstruction is the
    performance-robust part ``x_r = G(x)`` of an input; the performance-sensitive part is ``x_s = x - x_r``.

    Sizes are ours (FedFed uses a ResNet-style VAE): encoder conv 3x3 (``width`` channels) + ReLU + conv
    3x3 stride 2 to ``2 * latent`` channels (mean and log-variance of a spatial latent at half resolution);
    decoder transposed conv 4x4 stride 2 + ReLU + conv 3x3 back to the input channels, resized to the input
    size when it is odd."""

    def __init__(self, in_channels: int, width: int = 32, latent: int = 4):
        super().__init__()
        self.latent = latent
        self.encoder = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(width, 2 * latent, 3, stride=2, padding=1))
        self.decoder = nn.Sequential(nn.ConvTranspose2d(latent, width, 4, stride=2, padding=1), nn.ReLU(),
                                     nn.Conv2d(width, in_channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_r, mu, logvar); z is sampled in training mode and is mu in eval mode."""
        mu, logvar = self.encoder(x).chunk(2, dim=1)
        logvar = logvar.clamp(-10.0, 10.0)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        robust = self.decoder(z)
        if robust.shape[-2:] != x.shape[-2:]:
            robust = F.interpolate(robust, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return robust, mu, logvar


def add_gaussian_noise(x: torch.Tensor, std: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``x + N(0, std^2)`` element-wise (FedFed's privacy noise on shared features, mean 0)."""
    if std == 0:
        return x.clone()
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)
    return x + std * noise


def fedfed_distill_loss(model: nn.Module, distiller: FeatureDistiller, x: torch.Tensor, y: torch.Tensor, *,
                        noise_stds: Sequence[float], w_rec: float, w_kl: float, w_ce: float,
                        w_x_ce: float) -> torch.Tensor:
    """FedFed feature-distillation objective on one mini-batch (in the form of the authors' code as
    ported to FL-bench):

    ``w_rec ||G(x) - x||^2 + w_kl KL(q(z|x) || N(0, I)) + w_ce mean_s CE(f(x_s + n_s), y) + w_x_ce CE(f(x), y)``

    with ``x_s = x - G(x)`` and ``n_s ~ N(0, sigma_s^2)`` for each sigma_s in ``noise_stds``. Minimising it
    makes the robust part x_r = G(x) a low-capacity reconstruction of x (information bottleneck) while the
    noisy sensitive part x_s keeps what the classifier needs; both the distiller G and the classifier f
    get gradients. The KL term is averaged over samples and latent entries (ours; FL-bench divides the
    sum by batch x 3 x latent size)."""
    robust, mu, logvar = distiller(x)
    sensitive = x - robust
    noisy = torch.cat([add_gaussian_noise(sensitive, s) for s in noise_stds]) if noise_stds else sensitive
    reps = max(len(noise_stds), 1)
    logits = model(torch.cat([noisy, x]))
    n = len(x)
    ce_sensitive = F.cross_entropy(logits[:n * reps], y.repeat(reps))
    ce_x = F.cross_entropy(logits[n * reps:], y)
    rec = F.mse_loss(robust, x)
    kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
    return w_rec * rec + w_kl * kl + w_ce * ce_sensitive + w_x_ce * ce_x


@torch.no_grad()
def sensitive_features(distiller: FeatureDistiller, x: torch.Tensor, noise_std: float,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """FedFed's shared data: the performance-sensitive features ``x_s = x - G(x)`` of a
    client's inputs (distiller in eval mode: z = mu) protected by Gaussian noise ``x_s + N(0, sigma^2)``."""
    distiller.eval()
    out = []
    for i in range(0, len(x), EVAL_BATCH):
        xb = x[i:i + EVAL_BATCH]
        robust, _, _ = distiller(xb)
        out.append(xb - robust)
    sens = torch.cat(out) if out else x.clone()
    return add_gaussian_noise(sens, noise_std, generator)


def distill_rounds(cfg) -> int:
    """D = min(fedfed_distill_rounds, rounds - 1): at least the last round trains on shared features."""
    return max(0, min(int(cfg.fedfed_distill_rounds), int(cfg.rounds) - 1))


def empty_shared(input_shape) -> list[np.ndarray]:
    """The two shared-data arrays when nothing is sent: features (0, C, H, W) and labels (0,)."""
    return [np.zeros((0, *input_shape), np.float32), np.zeros(0, np.float32)]
