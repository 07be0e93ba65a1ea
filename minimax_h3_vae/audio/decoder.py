"""`H3AudioDecoder`: H3's audio latents to sound, as released.

    audio latents (C, 32, N), normalised, one stereo channel per batch item (2 in H3)
      -> z * latents_std + latents_mean per latent channel (float32, as the pipeline does)
      -> AudioDecoder (audio/model.py): dec_in_proj + BigVGAN, anti-aliased activations through the run's ops
      -> (C, 800 N) float32 waveform in [-1, 1] at 32 kHz

The fused path (CUDA, where Triton runs) swaps the eager anti-aliased activation for its kernel
(fused/anti_aliased_snake_beta.py), chosen as the video decoder's kernels are (`fused.choose_audio_kernels`,
from the same registry); everything else is the same float32 code.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from ..fused import AudioKernels, choose_audio_kernels, launch_counts, ops_for
from ..latents import check_audio_latents
from ..runtime import resolve_device, resolve_fused
from .config import H3AudioDecoderConfig
from .loading import DEFAULT_REPO, AudioCheckpoint, load_checkpoint, load_weights
from .model import AudioDecoder, Progress


class H3AudioDecoder(AudioDecoder):
    """Decodes MiniMax-H3 audio latents into a waveform per stereo channel, exactly as released, in float32.

    Build it with `H3AudioDecoder.from_pretrained(...)`; `decode(audio_latents)` is the whole release pipeline
    (denormalisation included). The checkpoint is `self.config`; `self.fused` says whether the fused path is
    on, and `self.kernels` what runs each op there (chosen once, at load); `launch_counts()` counts this
    decoder's kernel launches.
    """

    def __init__(self, config: H3AudioDecoderConfig, fused: bool = False):
        super().__init__(config)
        self.fused = fused
        self._kernels: dict[torch.device, AudioKernels] = {}  # the choice, per device the model ran on
        self._ops: dict[AudioKernels, SimpleNamespace] = {}  # the ops of each choice
        self._launches: dict[str, int] = {}  # the kernel launches of those ops (`launch_counts`)

    @classmethod
    def from_pretrained(
        cls,
        source: str | os.PathLike = DEFAULT_REPO,
        *,
        device: str | torch.device | None = None,
        revision: str | None = None,
        fused: bool | None = None,
    ) -> H3AudioDecoder:
        """Load the audio decoder from a hub repo id, a local repo root, an original `audio_vae/` folder (the
        release's `FL2VA/audio_vae/`), a diffusers `audio_vae/` folder, or a ComfyUI single `.safetensors` file.
        From the hub, only the audio VAE's files are downloaded.

        device: "cpu", "cuda", "cuda:N" (None: CUDA when available). fused: True / False (None: the
        MINIMAX_H3_VAE_FUSED variable, else on for CUDA when Triton imports); both are checked, as for the video
        decoder, before the checkpoint is opened. revision: for a hub repo id, a branch, tag or commit; none loads
        a cached copy without asking the hub, a branch or tag asks the hub for its newest commit first.
        """
        device = resolve_device(device)
        fused = resolve_fused(fused, device)
        return cls.from_checkpoint(load_checkpoint(source, revision=revision), device=device, fused=fused)

    @classmethod
    def from_checkpoint(
        cls, checkpoint: AudioCheckpoint, *, device: str | torch.device | None = None, fused: bool | None = None
    ) -> H3AudioDecoder:
        """Build the decoder from a located checkpoint (`audio.loading.load_checkpoint`), options as in
        `from_pretrained`."""
        device = resolve_device(device)
        fused = resolve_fused(fused, device)
        with torch.device("meta"):
            model = cls(checkpoint.config, fused)
        load_weights(model, checkpoint, device)
        model.ops()  # the kernels chosen once, at load (any warning comes here)
        return model

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def hop_length(self) -> int:
        """Samples per latent (800)."""
        return self.config.hop_length

    @property
    def kernels(self) -> AudioKernels:
        """What runs each op on the decoder's device (`fused.choose_audio_kernels`, chosen once per device: at
        load, with a warning naming each kernel that cannot run there and why; the eager op then runs)."""
        if self.device not in self._kernels:
            self._kernels[self.device] = choose_audio_kernels(self.config, self.device, self.fused)
        return self._kernels[self.device]

    def ops(self) -> SimpleNamespace:
        """The ops that run `self.kernels` (`fused.ops_for`: the eager ops of audio/model.py when all eager),
        made once per choice and kept, their launches counted into `launch_counts()`."""
        chosen = self.kernels
        if chosen not in self._ops:
            self._ops[chosen] = ops_for(chosen, self._launches)
        return self._ops[chosen]

    def launch_counts(self) -> dict[str, int]:
        """This decoder's kernel launches, per kernel of the registry (`fused.LAUNCH_NAMES`, as the video
        decoder's view): 'anti_aliased_snake_beta', and 0 for the video decoder's kernels."""
        return launch_counts(self._launches)

    def denormalize(self, audio_latents: torch.Tensor) -> torch.Tensor:
        """Pipeline audio latents (C, latent_channels, N) -> the decoder's input, float32 on its device:
        `z * latents_std + latents_mean` per latent channel, both float32 (the pipeline's arithmetic)."""
        check_audio_latents(audio_latents, self.config.latent_channels)
        z = audio_latents.to(device=self.device, dtype=torch.float32)
        std = torch.tensor(self.config.latents_std, dtype=torch.float32, device=self.device).view(1, -1, 1)
        mean = torch.tensor(self.config.latents_mean, dtype=torch.float32, device=self.device).view(1, -1, 1)
        return z * std + mean

    @torch.inference_mode()
    def decode(self, audio_latents: torch.Tensor, progress: Progress | None = None) -> torch.Tensor:
        """Normalised audio latents (C, latent_channels, N) as H3's pipeline makes them (C = 2: the stereo
        channels, left then right) -> waveform (C, N * hop_length) float32 in [-1, 1] at `sample_rate` Hz, on the
        decoder's device. Any C >= 1 is decoded, one mono channel per batch item.

        progress(done, total), when given, is called with total = the decoder's AMP blocks (21 in the release:
        3 per upsampling stage, each over every channel and sample of its stage) before the first block, then
        after each: done = 0, 1, ..., total. The latents are checked before the first call."""
        if self.device.type == "meta":
            raise ValueError(
                "the decoder's weights are on the meta device and hold no values: load it with from_pretrained"
            )
        if self.dec_in_proj.weight.dtype != torch.float32:
            raise ValueError(
                f"the audio decoder's weights were cast ({self.dec_in_proj.weight.dtype}): it runs in float32 only "
                "(bf16 decodes come out about 20 dB quieter); load it again"
            )
        z = self.denormalize(audio_latents)
        return self(z, self.ops(), progress).squeeze(1)
