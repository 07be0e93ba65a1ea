"""The mp4's colours (minimax_h3_vae/command/colour.py, the Mp4Sink): BT.709 limited-range Y'CbCr 4:2:0 with left
chroma siting, made in torch before the frames cross to ffmpeg, and a stream tagged bt709 / tv.

The conversion is checked against a float64 evaluation of BT.709's formula written out here; the mp4 is
written by the command itself (the decoder's stream replaced by chosen frames) and read back with ffmpeg:
as raw Y'CbCr planes, as RGB with the tags honoured, and for the tags it reports."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from command_runs import ffmpeg
from repo import TINY
from safetensors.torch import save_file

from minimax_h3_vae import H3VideoDecoder
from minimax_h3_vae.command import encoder, formats, output, readback
from minimax_h3_vae.command import main as cli_module
from minimax_h3_vae.command.colour import rgb_to_yuv420p, to_yuv420p_frames
from minimax_h3_vae.frames import IMAGENET_MEAN, IMAGENET_STD

# ITU-R BT.709's luma coefficients; 8-bit limited range: Y' 16-235, Cb and Cr 16-240.
KR, KB = 0.2126, 0.0722
KG = 1 - KR - KB


def reference(rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Y', Cb, Cr) of R'G'B' (3, F, H, W), float64 and unrounded, by BT.709's formula: Y' at full size;
    Cb and Cr computed at full size, then sampled at left siting (on luma column 2j, between rows 2i and
    2i + 1): weights 1/2, 1/2 over the rows and 1/4, 1/2, 1/4 over columns 2j - 1, 2j, 2j + 1, column -1
    repeating column 0."""
    r, g, b = rgb.double()
    e = KR * r + KG * g + KB * b
    y = 16 + 219 * e
    chroma = torch.stack([128 + 224 * (b - e) / (2 * (1 - KB)), 128 + 224 * (r - e) / (2 * (1 - KR))])
    rows = (chroma[..., 0::2, :] + chroma[..., 1::2, :]) / 2
    padded = F.pad(rows.flatten(0, 2)[:, None], (1, 0), mode="replicate")[:, 0].view(*rows.shape[:-1], -1)
    sited = (padded[..., 0:-1:2] + 2 * padded[..., 1::2] + padded[..., 2::2]) / 4
    return y, sited[0], sited[1]


def planes(out: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """yuv420p frames (F, H * W * 3 // 2) -> Y' (F, H, W), Cb and Cr (F, H / 2, W / 2)."""
    n = height * width
    y, cb, cr = out.split([n, n // 4, n // 4], dim=1)
    half = (out.shape[0], height // 2, width // 2)
    return y.reshape(out.shape[0], height, width), cb.reshape(half), cr.reshape(half)


# ---- the conversion ------------------------------------------------------------------------------------


def test_conversion_matches_the_float64_formula():
    """Random R'G'B' (with exact 0, 1 and 8-bit levels among them): every value is the float64 formula's,
    rounded to the nearest integer (halves to even), except where that value lies within float32's error
    of a half, where it may land on either side. The bound: a dozen float32 operations on values below
    256, each off by at most half an ulp of 256 (2^-16), stay within 2^-12."""
    gen = torch.Generator().manual_seed(0)
    rgb = torch.rand(3, 4, 48, 80, generator=gen)
    rgb[:, 1] = torch.randint(0, 256, (3, 48, 80), generator=gen) / 255.0
    rgb[:, 2, :, :40] = torch.randint(0, 2, (3, 48, 40), generator=gen).float()
    out = rgb_to_yuv420p(rgb)
    assert out.dtype == torch.uint8 and out.shape == (4, 48 * 80 * 3 // 2) and out.is_contiguous()
    band = 2.0**-12
    for got, want in zip(planes(out, 48, 80), reference(rgb), strict=True):
        got = got.double()
        near_half = ((want - want.floor()) - 0.5).abs() < band
        assert (got - torch.round(want)).abs().max() <= 1
        assert torch.equal(got[~near_half], torch.round(want)[~near_half])
        assert near_half.double().mean() < 0.01  # the exemption covers few values
    y, cb, cr = planes(out, 48, 80)
    assert y.min() >= 16 and y.max() <= 235 and cb.min() >= 16 and cb.max() <= 240 and cr.max() <= 240


def test_the_cube_corners_take_the_range_ends():
    """BT.709 limited range: black and white at Y' 16 and 235; blue and yellow at Cb 240 and 16; red and
    cyan at Cr 240 and 16; greys at Cb = Cr = 128."""
    corners = {  # colour: (Y', Cb, Cr), from the formula in exact arithmetic, rounded
        (0, 0, 0): (16, 128, 128),
        (1, 1, 1): (235, 128, 128),
        (1, 0, 0): (63, 102, 240),
        (0, 1, 0): (173, 42, 26),
        (0, 0, 1): (32, 240, 118),
        (1, 1, 0): (219, 16, 138),
        (0, 1, 1): (188, 154, 16),
        (1, 0, 1): (78, 214, 230),
    }
    rgb = torch.tensor(list(corners), dtype=torch.float32).T[:, :, None, None].expand(3, len(corners), 4, 6)
    for got, want in zip(planes(rgb_to_yuv420p(rgb), 4, 6), zip(*corners.values(), strict=True), strict=True):
        assert got.flatten(1).amin(1).tolist() == list(want) == got.flatten(1).amax(1).tolist()


def test_chroma_is_sited_left():
    """A red ramp along x: with left siting each chroma sample is the ramp's value on luma column 2j (the
    filter is symmetric about it), not between columns 2j and 2j + 1 as centred (JPEG) siting would put it;
    at j = 0 the repeated column 0 weighs 3/4. Along y the sample sits between rows 2i and 2i + 1."""
    width = 32
    ramp = torch.arange(width, dtype=torch.float64) / (width - 1)  # Cr = 128 + 112 R for G = B = 0
    rgb = torch.zeros(3, 1, 2, width)
    rgb[0] = ramp.float()
    cr = planes(rgb_to_yuv420p(rgb), 2, width)[2][0, 0].double()
    columns = torch.arange(width // 2, dtype=torch.float64) * 2
    left = 128 + 112 * columns / (width - 1)
    left[0] = 128 + 112 * (ramp[1] / 4)
    assert ((left - left.floor() - 0.5).abs() > 0.01).all()  # no value at a rounding tie
    assert torch.equal(cr, torch.round(left))
    centred = torch.round(128 + 112 * (columns + 0.5) / (width - 1))
    assert (cr[1:] != centred[1:]).all()  # half a pixel is 1.8 levels here

    rgb = torch.zeros(3, 1, width, 2)
    rgb[0] = ramp.float()[:, None]
    cr = planes(rgb_to_yuv420p(rgb), width, 2)[2][0, :, 0].double()
    assert torch.equal(cr, torch.round(128 + 112 * (columns + 0.5) / (width - 1)))


def test_out_of_range_input_is_clamped_and_nan_is_zero():
    """A direct caller's R'G'B' outside [0, 1] is clamped per component, NaN taken as 0, so nothing wraps
    around uint8 (1.5 once gave Y' 88, NaN gave Y' 0): each such colour gives the cube corner it clamps to."""
    nan, inf = float("nan"), float("inf")
    colours = {  # input: the corner it is taken as
        (1.5, 1.5, 1.5): (1, 1, 1),
        (-0.5, -3.0, -inf): (0, 0, 0),
        (nan, nan, nan): (0, 0, 0),
        (inf, nan, -1.0): (1, 0, 0),
        (nan, 2.0, 7.0): (0, 1, 1),
        (1e30, -1e30, nan): (1, 0, 0),
    }
    rgb = torch.tensor(list(colours), dtype=torch.float32).T[:, :, None, None].expand(3, len(colours), 4, 6)
    want = torch.tensor(list(colours.values()), dtype=torch.float32).T[:, :, None, None].expand_as(rgb)
    got = rgb_to_yuv420p(rgb)
    assert torch.equal(got, rgb_to_yuv420p(want))
    y, cb, cr = planes(got, 4, 6)
    assert y[0].unique().tolist() == [235] and y[1].unique().tolist() == [16] and y[2].unique().tolist() == [16]
    assert cb.min() >= 16 and cb.max() <= 240 and cr.min() >= 16 and cr.max() <= 240
    assert torch.isnan(rgb).any()  # the input itself is left as it was


def test_in_range_input_converts_as_before_the_clamp():
    """The clamp changes no bit for R'G'B' in [0, 1]: the planes' hash for seeded random input (with exact
    0 and 1 among it) is the one the unclamped conversion gave (commit 38e809c), which
    test_conversion_matches_the_float64_formula checks against BT.709 in float64."""
    gen = torch.Generator().manual_seed(5)
    rgb = torch.rand(3, 3, 32, 48, generator=gen)
    rgb[:, 0, :, :24] = torch.randint(0, 2, (3, 32, 24), generator=gen).float()
    digest = hashlib.sha256(rgb_to_yuv420p(rgb).numpy().tobytes()).hexdigest()
    assert digest == "50bfaeb342f4bf40ac310b83736499fad21a1b3c9a424b0c74f2877a5bf8b75e"


@pytest.mark.parametrize(
    "shape, words",
    [((3, 1, 5, 6), "even"), ((3, 1, 6, 7), "even"), ((1, 6, 8, 3), "(3, F, H, W)"), ((3, 6, 8), "(3, F, H, W)")],
)
def test_conversion_refuses_other_layouts(shape, words):
    """4:2:0 halves both sizes: odd ones are refused (the decoder's frames are multiples of 16 px)."""
    with pytest.raises(ValueError, match=re.escape(words)):
        rgb_to_yuv420p(torch.rand(shape))
    with pytest.raises(ValueError, match="floating-point"):
        rgb_to_yuv420p(torch.zeros(3, 1, 4, 4, dtype=torch.uint8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_conversion_runs_on_the_gpu():
    """A CUDA chunk is converted on the GPU (so 1.5 bytes per pixel cross to the host, not 3), to the CPU's
    planes up to float32 rounding: values at a half may land either side."""
    video = torch.randn(1, 3, 17, 256, 320, generator=torch.Generator().manual_seed(1)).half()
    on_gpu = to_yuv420p_frames(video.cuda())
    assert on_gpu.is_cuda and on_gpu.dtype == torch.uint8 and on_gpu.shape == (17, 256 * 320 * 3 // 2)
    diff = (on_gpu.cpu().int() - to_yuv420p_frames(video).int()).abs()
    assert diff.max() <= 1 and (diff > 0).double().mean() < 1e-3


def test_mp4_sink_takes_planes_and_lossless_takes_rgb(tmp_path):
    """The sink of a crf > 0 mp4 takes yuv420p planes (half the bytes of RGB) and refuses RGB frames; that
    of crf 0 (lossless RGB, unchanged) and of .safetensors take uint8 RGB."""
    video = torch.randn(1, 3, 2, 32, 48)
    sink = output.open_sink(tmp_path / "a.mp4", formats.VideoFormat(2, 32, 48, 24.0, crf=17))
    try:
        frames = sink.convert(video)
        assert frames.shape == (2, 32 * 48 * 3 // 2) and frames.dtype == torch.uint8
        with pytest.raises(ValueError, match=r"uint8 \(f, 2304\)"):
            sink.write(torch.zeros(2, 32, 48, 3, dtype=torch.uint8))
    finally:
        sink.discard()
    for name, crf in (("b.mp4", 0), ("c.safetensors", 17)):
        sink = output.open_sink(tmp_path / name, formats.VideoFormat(2, 32, 48, 24.0, crf=crf))
        try:
            assert sink.convert(video).shape == (2, 32, 48, 3)
        finally:
            sink.discard()


def scalers(command: list[str], width: int, height: int) -> list[str]:
    """ffmpeg's debug lines for the scale filters it inserts by itself (its colour and format conversions)
    while encoding one frame with `command`, fed enough bytes for an RGB frame."""
    command = list(command)
    command[command.index("-v") + 1] = "debug"  # ffmpeg takes the first -v it finds
    result = subprocess.run(
        [*command, "-frames:v", "1", "-f", "null", "-"], input=bytes(width * height * 3), capture_output=True
    )
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.decode().splitlines() if "auto-inserting filter 'auto_scale" in line]


def test_ffmpeg_converts_nothing():
    """The encoder gets the planes as they are piped: ffmpeg inserts no scaler (no swscale pass) for the
    yuv420p mp4, nor for lossless RGB. The check sees one where ffmpeg must convert (rgb24 in, yuv420p out)."""
    for crf in (17, 0):
        assert scalers(encoder.encoder_command(64, 32, 24.0, crf, formats.DEFAULT_PRESET), 64, 32) == []
    ff = encoder.ffmpeg_exe()
    converting = [ff, "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", "64x32", "-i", "-", "-c:v", "libx264"]
    assert scalers([*converting, "-pix_fmt", "yuv420p", "-v", "error"], 64, 32)


# ---- the mp4, written by the command and read back by ffmpeg -----------------------------------------

HEIGHT, WIDTH, FPS = 64, 128, 24.0
COLOURS = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 0), (1, 1, 1), (0, 0, 0)]


def colour_frames() -> torch.Tensor:
    """R'G'B' (3, 9, 64, 128) in [0, 1]: eight flat colours (the primaries, their complements, white, black),
    then a grey ramp of eight levels from black to white in bands 16 px wide (H.264's macroblocks, so every
    block is flat and the encoder's error stays out of what is measured)."""
    rgb = torch.zeros(3, len(COLOURS) + 1, HEIGHT, WIDTH)
    for i, colour in enumerate(COLOURS):
        rgb[:, i] = torch.tensor(colour, dtype=torch.float32)[:, None, None]
    rgb[:, -1] = (torch.arange(WIDTH) // 16 / 7.0)[None, None, :]
    return rgb


@pytest.fixture(scope="module", params=[1, 17], ids=["crf1", "crf17"])
def written(request, tmp_path_factory) -> tuple[Path, int]:
    """An mp4 written by `minimax-h3-decode --crf N`, the decoder's chunks (5 frames, then 4) replaced by
    `colour_frames` in the decoder's ImageNet-normalised output space."""
    folder = tmp_path_factory.mktemp(f"crf{request.param}")
    latents = folder / "z.safetensors"
    save_file({"latents": torch.zeros(24, 3, HEIGHT // 16, WIDTH // 16)}, str(latents))  # 9 frames
    std, mean = (torch.tensor(v).view(3, 1, 1, 1) for v in (IMAGENET_STD, IMAGENET_MEAN))
    video = ((colour_frames() - mean) / std)[None]

    def decode_stream(self, z, progress=None, **options):
        yield video[:, :, :5]
        yield video[:, :, 5:]

    out = folder / "video.mp4"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(H3VideoDecoder, "decode_stream", decode_stream)
        patch.setenv("HF_HUB_OFFLINE", "1")
        args = [str(latents), str(out), "--model", str(TINY), "--device", "cpu", "--eager", "--crf", str(request.param)]
        assert cli_module.main(args) == 0
    return out, request.param


def read_yuv(path: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mp4's decoded planes as ffmpeg reads them, raw yuv420p (no conversion: it is the stream's own)."""
    result = ffmpeg("-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "yuv420p", "-")
    assert result.returncode == 0, result.stderr
    frames = torch.frombuffer(bytearray(result.stdout), dtype=torch.uint8).view(-1, HEIGHT * WIDTH * 3 // 2)
    return planes(frames, HEIGHT, WIDTH)


def test_planes_are_bt709_limited_range(written):
    """Every plane read back is within one level of BT.709's exact value (the conversion rounds once, and
    flat 16x16 blocks come out of x264 as they went in)."""
    path, _ = written
    got = read_yuv(path)
    assert got[0].shape[0] == len(COLOURS) + 1
    for plane, exact in zip(got, reference(colour_frames()), strict=True):
        assert (plane.double() - exact).abs().max() <= 1


def test_ffmpeg_reports_the_tags(written):
    """ffmpeg reads bt709 primaries, transfer and matrix (printed once when all three agree), tv range and
    left siting from the mp4, and the same from the bare H.264 stream: the tags are in the VUI, not only in
    the mp4's colr box."""
    path, _ = written
    tags = "yuv420p(tv, bt709, progressive, left)"
    assert tags in ffmpeg("-v", "verbose", "-i", str(path)).stderr.decode()
    stream = path.with_suffix(".h264")
    assert ffmpeg("-v", "error", "-i", str(path), "-c", "copy", "-f", "h264", "-y", str(stream)).returncode == 0
    assert tags in ffmpeg("-v", "verbose", "-i", str(stream)).stderr.decode()


def test_rgb_read_back_with_the_tags_is_the_input(written):
    """Decoded to RGB as a player does (BT.709, tv range), the frames are the input within the codec's
    error. The bound, per channel: one level of Y'CbCr error (test_planes_are_bt709_limited_range) through
    the inverse matrix, in 8-bit RGB levels, plus one level for ffmpeg's own rounding to rgb24 (half a
    level) and its fixed-point arithmetic (at most half a level with accurate_rnd)."""
    path, _ = written
    scale = "scale=in_color_matrix=bt709:in_range=tv:flags=accurate_rnd+full_chroma_int"
    result = ffmpeg("-v", "error", "-i", str(path), "-vf", scale, "-f", "rawvideo", "-pix_fmt", "rgb24", "-")
    assert result.returncode == 0, result.stderr
    got = np.frombuffer(result.stdout, np.uint8).reshape(-1, HEIGHT, WIDTH, 3).astype(np.float64)
    want = colour_frames().permute(1, 2, 3, 0).double().numpy() * 255
    # d(R, G, B) / d(Y', Cb, Cr), each in 8-bit levels
    inverse = np.array(
        [
            [255 / 219, 0, 255 / 224 * 2 * (1 - KR)],
            [255 / 219, -255 / 224 * 2 * (1 - KB) * KB / KG, -255 / 224 * 2 * (1 - KR) * KR / KG],
            [255 / 219, 255 / 224 * 2 * (1 - KB), 0],
        ]
    )
    bound = np.abs(inverse).sum(axis=1) + 1.0  # R 3.96, G 2.91, B 4.28
    assert got.shape == want.shape
    assert (np.abs(got - want).max(axis=(0, 1, 2)) <= bound).all(), np.abs(got - want).max(axis=(0, 1, 2))


def test_frame_count_and_duration(written):
    """As before the conversion moved: every frame is in the file (counted from its packets and decoded),
    and the duration is frames / fps."""
    path, _ = written
    assert readback.read_back(path)[0] == len(COLOURS) + 1
    assert read_yuv(path)[0].shape[0] == len(COLOURS) + 1
    match = re.search(r"Duration: (\d+):(\d+):(\d+\.\d+)", ffmpeg("-i", str(path)).stderr.decode())
    hours, minutes, seconds = match.groups()
    assert int(hours) == int(minutes) == 0
    assert float(seconds) == pytest.approx((len(COLOURS) + 1) / FPS, abs=0.01)
