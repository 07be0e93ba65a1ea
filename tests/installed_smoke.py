"""The installed package with its dependencies at their declared floors, run from outside the checkout: .ci/run
runs `python <checkout>/tests/installed_smoke.py` in its wheel venv (this folder, not the checkout, is on the path).

Both decoders load the shipped tiny checkpoints through the hub code path, offline, from a Hugging Face cache
laid out as huggingface_hub writes it; they hold the same weights as when loaded from the folder, and decode the
example latents to frames and sound of the expected shapes. A repo missing from the cache is the named error.
Prints one line and exits 0, or raises."""

from __future__ import annotations

import os
import tempfile
from importlib.metadata import version
from pathlib import Path

from hub_cache import add_repo
from repo import EXAMPLE_LATENTS, REPO, TINY

DEPENDENCIES = ("torch", "numpy", "safetensors", "huggingface_hub", "tqdm", "imageio-ffmpeg")


def same_weights(hub, local) -> None:
    ours, theirs = hub.state_dict(), local.state_dict()
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours), "hub and folder differ"


def main() -> None:
    with tempfile.TemporaryDirectory() as home:
        cache = Path(home) / "hub"
        # huggingface_hub reads these once, at import: set before anything imports it.
        os.environ.update(HF_HOME=home, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
        import minimax_h3_vae
        from minimax_h3_vae import H3AudioDecoder, H3VideoDecoder, denormalize_latents, load_latents, to_uint8_frames
        from minimax_h3_vae.checkpoints import CheckpointError

        installed = Path(minimax_h3_vae.__file__).resolve()
        assert REPO not in installed.parents, f"{installed}: the checkout's package, not the installed one"
        files = {f"FL2VA/{p.relative_to(TINY).as_posix()}": p for p in TINY.rglob("*") if p.is_file()}
        add_repo(cache, "Org/H3", files)

        video = H3VideoDecoder.from_pretrained("Org/H3", device="cpu", fused=False)
        same_weights(video, H3VideoDecoder.from_pretrained(TINY, device="cpu", fused=False))
        audio = H3AudioDecoder.from_pretrained("Org/H3", device="cpu", fused=False)
        same_weights(audio, H3AudioDecoder.from_pretrained(TINY, device="cpu", fused=False))

        latents, fps, audio_latents = load_latents(EXAMPLE_LATENTS)
        frames = to_uint8_frames(video.decode(denormalize_latents(latents, video.config))[:1])
        assert tuple(frames.shape) == (39, 256, 320, 3) and fps == 24, (frames.shape, fps)
        sound = audio.decode(audio_latents)
        assert tuple(sound.shape) == (2, 52000) and 0 < sound.std() < 1, sound.shape

        try:
            H3VideoDecoder.from_pretrained("Org/Absent", device="cpu")
        except CheckpointError as error:
            assert "not in the local Hugging Face cache" in str(error), error
        else:
            raise AssertionError("a repo missing from the offline cache loaded")
    print("installed package OK from the hub cache:", ", ".join(f"{n} {version(n)}" for n in DEPENDENCIES))


if __name__ == "__main__":
    main()
