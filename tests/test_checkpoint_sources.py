"""What the user names as a checkpoint, read one way by both decoders' loaders: a local path, else a hub repo id,
else an error naming the problem."""

from __future__ import annotations

import pytest

from minimax_h3_vae.audio.loading import load_checkpoint as load_audio_checkpoint
from minimax_h3_vae.checkpoints import CheckpointError, load_checkpoint

LOADERS = {"video": load_checkpoint, "audio": load_audio_checkpoint}


@pytest.mark.parametrize("decoder", LOADERS)
def test_a_name_too_long_to_look_at_is_named(tmp_path, decoder):
    with pytest.raises(CheckpointError, match=r"cannot look there \(File name too long\)"):
        LOADERS[decoder](tmp_path / ("x" * 300))


@pytest.mark.parametrize("decoder", LOADERS)
def test_a_revision_of_a_local_path_is_refused(tmp_path, decoder):
    with pytest.raises(CheckpointError, match="is a local path; a revision .'main'. applies to hub repo ids only"):
        LOADERS[decoder](tmp_path, revision="main")


@pytest.mark.parametrize("decoder", LOADERS)
def test_a_missing_path_that_is_no_repo_id_is_named(tmp_path, decoder):
    with pytest.raises(CheckpointError, match="no such file or folder, and not a hub repo id"):
        LOADERS[decoder](tmp_path / "no" / "such")


@pytest.mark.parametrize("decoder", LOADERS)
def test_a_single_file_must_be_safetensors(tmp_path, decoder):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError, match="a single-file checkpoint must be a .safetensors file"):
        LOADERS[decoder](tmp_path / "weights.bin")
