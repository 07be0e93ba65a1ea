"""The audio VAE decoder's configuration: one frozen dataclass. Defaults are the released model.

It describes the model only; each layout's config file is mapped onto it by audio/loading.py (docs/audio.md
section 2 lists the files and their fields).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..config import ConfigError, check_whole_number, set_latent_statistics

# Per-channel statistics of the released audio latents (audio_vae/config.json, as diffusers' pipeline reads
# them). The pipeline's audio latents are normalised with them; the decoder consumes `z * std + mean`.
RELEASED_AUDIO_LATENTS_MEAN = (
    -0.020211687488382354,
    0.3876466479950502,
    -0.04398279799186767,
    -0.28591514936373,
    0.08179686214561671,
    -0.35782641352446604,
    0.040623809960919084,
    -0.01552534501956604,
    -0.223362481667332,
    0.1821006842509091,
    0.2941778783780663,
    -0.07901167601970885,
    -0.056815072777201,
    -0.3699028221860095,
    -0.31616315591624855,
    0.5905951377425391,
    -0.052139568068853864,
    0.013673160263486295,
    -0.03691647864630577,
    0.09732660653298163,
    -0.3394662328788498,
    -0.30685677538541667,
    -0.24504598907458763,
    -0.034698524462007344,
    0.02868032184767538,
    -0.21217779266454084,
    -0.1678263169941987,
    0.3221287889040614,
    -0.1223055851554907,
    0.4356604928128464,
    -0.0502599202236253,
    0.3979258376211797,
)
RELEASED_AUDIO_LATENTS_STD = (
    1.6895524230479284,
    2.76263727217653,
    1.7945344281264435,
    1.6801681847309828,
    1.6390226546605453,
    2.7788298348882177,
    1.7659090095747236,
    1.6199757612137327,
    2.6336525640336896,
    1.8539356672817833,
    2.5056497896915633,
    1.811019237886178,
    1.9579657790720237,
    1.6685498243529284,
    1.4922469314453364,
    3.298670198067373,
    1.9491804496832168,
    1.8720003270431442,
    1.8334080103291832,
    1.6488070416529093,
    1.6176957696319716,
    1.9131449234774398,
    1.5695245398428617,
    1.6943659940415912,
    1.8318420762504692,
    1.5540637421583379,
    1.9344930328968526,
    1.599198216109855,
    1.718045989838149,
    1.6307219190837705,
    1.8661226051202384,
    1.5613768203168363,
)

# The BigVGAN block of the released code for its 32 kHz models, which the original layout does not write down
# (the release builds it from `sample_rate`): upsampling rates and kernels, AMP block kernels and dilations.
RELEASED_UPSAMPLE_RATES = (5, 5, 2, 2, 2, 2, 2)
RELEASED_UPSAMPLE_KERNEL_SIZES = (9, 9, 4, 4, 4, 4, 4)
RELEASED_RESBLOCK_KERNEL_SIZES = (3, 7, 11)
RELEASED_RESBLOCK_DILATIONS = ((1, 3, 5), (1, 3, 5), (1, 3, 5))


@dataclass(frozen=True)
class H3AudioDecoderConfig:
    """Everything that shapes the audio decoder: `dec_in_proj` (a 1x1 conv, latent_channels -> latent_dim), then
    BigVGAN (conv_pre latent_dim -> decoder_dim, one transposed-conv upsampler per rate, each followed by the
    mean of one AMP block per resblock kernel, then the final activation and conv to one channel).

    Stage i runs at `decoder_dim // 2**(i + 1)` channels; a latent becomes `hop_length = prod(upsample_rates)`
    samples at `sample_rate` Hz.
    """

    latent_channels: int = 32  # z channels (`vae_latent_channels`)
    latent_dim: int = 2048  # dec_in_proj's output, conv_pre's input
    decoder_dim: int = 1024  # conv_pre's output (BigVGAN's `upsample_initial_channel`)
    upsample_rates: tuple[int, ...] = RELEASED_UPSAMPLE_RATES
    upsample_kernel_sizes: tuple[int, ...] = RELEASED_UPSAMPLE_KERNEL_SIZES
    resblock_kernel_sizes: tuple[int, ...] = RELEASED_RESBLOCK_KERNEL_SIZES
    resblock_dilations: tuple[tuple[int, ...], ...] = RELEASED_RESBLOCK_DILATIONS
    sample_rate: int = 32000
    latents_mean: tuple[float, ...] = RELEASED_AUDIO_LATENTS_MEAN
    latents_std: tuple[float, ...] = RELEASED_AUDIO_LATENTS_STD

    def __post_init__(self):
        for name, (least, most) in _INT_FIELDS.items():
            check_whole_number(name, getattr(self, name), least, most)
        for name in ("upsample_rates", "upsample_kernel_sizes", "resblock_kernel_sizes"):
            object.__setattr__(self, name, _int_tuple(name, getattr(self, name), 1, _MAX_KERNEL))
        dilations = self.resblock_dilations
        if not isinstance(dilations, (list, tuple)) or not all(isinstance(d, (list, tuple)) for d in dilations):
            raise ConfigError(f"resblock_dilations must be a list of lists of whole numbers, got {dilations!r}")
        object.__setattr__(
            self, "resblock_dilations", tuple(_int_tuple("resblock_dilations", d, 1, _MAX_KERNEL) for d in dilations)
        )
        self._check_geometry()
        set_latent_statistics(self)

    def _check_geometry(self) -> None:
        rates, kernels = self.upsample_rates, self.upsample_kernel_sizes
        if len(rates) > _MAX_STAGES or len(rates) != len(kernels):
            raise ConfigError(
                f"upsample_rates {list(rates)} and upsample_kernel_sizes {list(kernels)} must pair up, one per "
                f"upsampling stage (1 to {_MAX_STAGES})"
            )
        for rate, kernel in zip(rates, kernels):
            # Padding (kernel - rate) / 2 on each side: the upsampler then makes exactly `rate` samples per input.
            if kernel < rate or (kernel - rate) % 2:
                raise ConfigError(
                    f"upsampling kernel {kernel} with rate {rate}: the kernel must exceed the rate by an even "
                    "number, so that each stage makes exactly rate x its input samples"
                )
        if self.decoder_dim >> len(rates) < 1:
            raise ConfigError(
                f"decoder_dim {self.decoder_dim} cannot be halved {len(rates)} times (one per upsampling stage)"
            )
        blocks, dilations = self.resblock_kernel_sizes, self.resblock_dilations
        if len(blocks) > _MAX_STAGES or len(blocks) != len(dilations) or not all(dilations):
            raise ConfigError(
                f"resblock_kernel_sizes {list(blocks)} and resblock_dilations {[list(d) for d in dilations]} must "
                f"pair up, one non-empty list of dilations per AMP block (1 to {_MAX_STAGES} blocks)"
            )
        if any(kernel % 2 == 0 for kernel in blocks):
            raise ConfigError(f"resblock_kernel_sizes must be odd (the AMP convs keep the length), got {list(blocks)}")

    @property
    def hop_length(self) -> int:
        """Samples per latent: the product of the upsampling rates (800)."""
        return math.prod(self.upsample_rates)

    @property
    def latents_per_second(self) -> float:
        return self.sample_rate / self.hop_length

    def stage_channels(self, stage: int) -> int:
        """Channels after upsampling stage `stage` (0-based): 512, 256, ... 8 in the release."""
        return self.decoder_dim // 2 ** (stage + 1)

    def replace(self, **changes) -> H3AudioDecoderConfig:
        return dataclasses.replace(self, **changes)


def _int_tuple(name: str, values, least: int, most: int) -> tuple[int, ...]:
    if not isinstance(values, (list, tuple)) or not values or len(values) > _MAX_STAGES:
        raise ConfigError(f"{name} must be a list of 1 to {_MAX_STAGES} whole numbers, got {values!r}")
    for value in values:
        check_whole_number(f"each of {name}", value, least, most)
    return tuple(values)


# Far beyond the release (32 channels, width 2048 -> 1024, 7 stages, kernels up to 11, 32 kHz), and small
# enough that nothing is sized by an absurd number read from a file; the tensors bound the widths further.
_INT_FIELDS = {
    "latent_channels": (1, 1024),
    "latent_dim": (1, 65536),
    "decoder_dim": (1, 65536),
    "sample_rate": (1, 1_000_000),
}
_MAX_STAGES = 16
_MAX_KERNEL = 1024
