"""The command's flags: parsed (`parse_args`), turned into the library's run options (`decode_options`), and
the output's own settings checked (`check_arguments`)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..latents import check_fps
from ..text import nearest, parse_number, parse_whole, shown
from . import formats
from .report import InputError, say

DEFAULT_CRF = 17


# The fused fp16 path's kernel flags: (flag, choices, default, help). The default is torch's own,
# because the faster Hopper kernels import quack, which takes 8-17 s, more than it saves on one clip.
KERNEL_FLAGS = (
    (
        "--gemm",
        ("auto", "cublas", "quack"),
        "cublas",
        "GEMMs of the fused fp16 path: cublas (default: importing quack takes 8-17 s, more than it saves on one "
        "clip), quack (Hopper, the hopper extra; with it --exact is on by default, the release's bits a little "
        "faster than cublas; with --no-exact ~7%% faster than cublas) or auto (quack where it runs)",
    ),
    (
        "--attention",
        ("auto", "sdpa", "fa4"),
        "sdpa",
        "attention of the fused fp16 path: sdpa (default: torch's; FlashAttention 4 imports quack, 8-17 s), "
        "fa4 (Hopper, the hopper extra; ~4%% faster per unit) or auto (fa4 where it runs)",
    ),
)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as the one-line `error:` of every other bad input (exit code 2), flags taken
    only as written (an abbreviation such as --tile is refused, not read as --tile-batch), and an unknown flag
    named with the nearest one."""

    def __init__(self, **kwargs):
        self.flags: list[str] = []  # before argparse's own --help is added
        super().__init__(allow_abbrev=False, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.flags += action.option_strings
        return action

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        flags = [word.split("=", 1)[0] for word in unknown if re.match(r"--?[^\W\d]", word)]
        if flags:
            near = nearest(flags[0], self.flags)
            self.error(f"unknown flag {flags[0]}" + (f" (did you mean {near}?)" if near else ""))
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed

    def error(self, message: str):
        say(f"error: {message} (see {self.prog} --help)")
        sys.exit(2)


# --help's opening: what the command does and takes, for its users (the module docstring is for developers).
DESCRIPTION = """Decode MiniMax-H3 latents to video: an mp4 with its sound, the frames as a .safetensors file, or
the sound alone as .wav or .flac.

IN is a latents .safetensors file (save_latents, or a ComfyUI .latent): the pipeline's normalised latents
(24, T, h, w) or (1, 24, T, h, w), and the clip's audio latents when it has sound. OUT appears only once it
is complete and verified. Bad input: one error line, exit code 2. Reference: docs/command.md."""


EXAMPLES = """examples:
  minimax-h3-decode latents.safetensors out.mp4                           # the released VAE, from the hub
  minimax-h3-decode latents.safetensors out.mp4 --model /models/MiniMax-H3 --fps 24
  minimax-h3-decode examples/latents.safetensors example.mp4 --model examples/tiny_h3_vae   # in the checkout
  minimax-h3-decode latents.safetensors frames.safetensors --device cpu   # uint8 frames, no ffmpeg needed
  minimax-h3-decode latents.safetensors sound.wav                         # the sound alone
  minimax-h3-decode latents.safetensors out.mp4 --model vae.safetensors --audio-model audio_vae.safetensors"""


def flag_type(parse):
    """An argparse type reading a flag's value the one strict way (text.parse_number or parse_whole)."""

    def read(text: str):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return read


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="minimax-h3-decode",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", type=Path, metavar="IN", help="latents .safetensors file")
    parser.add_argument(
        "output",
        type=Path,
        metavar="OUT",
        help="output .mp4 (H.264, with AAC sound when IN holds audio latents), .safetensors (uint8 frames 'video', "
        "float32 sound 'audio'), or .wav / .flac (the sound alone)",
    )
    parser.add_argument(
        "--model",
        default="MiniMaxAI/MiniMax-H3",
        help="hub repo id, repo root, video_vae/ or vae/ folder, or single .safetensors file "
        "(default: MiniMaxAI/MiniMax-H3 from the Hugging Face hub, or its cached copy)",
    )
    parser.add_argument(
        "--revision",
        help="hub branch, tag or commit of --model (default: the cached main, else the hub's); a branch or tag "
        "asks the hub for its newest commit",
    )
    parser.add_argument(
        "--audio-model",
        metavar="SOURCE",
        help="the audio VAE: hub repo id, repo root, audio_vae/ folder or ComfyUI audio .safetensors file (default: "
        "--model's own, or the audio_vae/ folder beside a video_vae/ or vae/ folder)",
    )
    parser.add_argument("--no-audio", action="store_true", help="leave IN's audio latents out: the video alone")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), help="default: fp16 (release recipe) on cuda, else fp32")
    parser.add_argument(
        "--fps",
        type=flag_type(parse_number),
        help="frame rate, 0.01 to 1000 (default: the input's fps metadata, else 24)",
    )
    parser.add_argument(
        "--crf",
        type=flag_type(parse_whole),
        default=DEFAULT_CRF,
        help="mp4 quality, 0-51, lower is better (default 17); 0 is lossless RGB (exact frames, few players)",
    )
    parser.add_argument(
        "--preset",
        choices=formats.X264_PRESETS,
        default=formats.DEFAULT_PRESET,
        help=f"mp4 encoder speed against file size (default: {formats.DEFAULT_PRESET}; medium is ffmpeg's)",
    )
    parser.add_argument("--raw-latents", action="store_true", help="latents are already denormalised")
    parser.add_argument("--eager", action="store_true", help="do not use the fused Triton kernels")
    parser.add_argument(
        "--tile-batch",
        type=flag_type(parse_whole),
        metavar="N",
        help="tiles per decoder call (default: as many as fit; lower it to save GPU memory)",
    )
    for flag, choices, default, help in KERNEL_FLAGS:
        parser.add_argument(flag, choices=choices, default=default, help=help)
    parser.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        help="bit for bit the release's decode (fp16: its eager fp16-autocast decode) on the fused path too: "
        "only the kernels that keep every rounding, with SDPA (and of quack's GEMMs only w1's). Default: on "
        "where it costs nothing (with --gemm quack, unless --attention fa4, the fastest), else off",
    )
    parser.add_argument(
        "--offload",
        choices=("auto", "none", "blocks"),
        default="auto",
        help="blocks: stream the block weights from host memory (small GPUs); auto (default): only if needed",
    )
    parser.add_argument(
        "--max-gpu-memory",
        type=flag_type(parse_number),
        metavar="GIB",
        help="GPU memory the decoder may hold, weights included",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show where the time went (by phase) and, on failure, the traceback"
    )
    return parser.parse_args(argv)


# Each run option's command-line flag, for the messages of DecodeOptions' checks.
FLAGS = {
    "device": "--device",
    "dtype": "--dtype",
    "tile_batch": "--tile-batch",
    "max_gpu_memory": "--max-gpu-memory",
    "offload": "--offload",
    "gemm": "--gemm",
    "attention": "--attention",
    "exact": "--exact",
}


def decode_options(args: argparse.Namespace, device=None):
    """The command's run options, checked by `DecodeOptions` as at every other door and by what this machine
    runs (`runtime.check_machine`), with the device and dtype made definite; InputError naming the flag.
    `device`: this rank's device under torchrun (else --device)."""
    from ..runtime import DecodeOptions, check_machine

    try:
        options = DecodeOptions(
            device=device or args.device,
            dtype=args.dtype,
            fused=False if args.eager else None,
            exact=args.exact,
            tile_batch=args.tile_batch,
            offload=args.offload,
            max_gpu_memory=args.max_gpu_memory,
            gemm=args.gemm,
            attention=args.attention,
        )
        device, dtype = check_machine(options)[:2]
        return options.replace(device=device, dtype=dtype)
    except ValueError as error:
        message = str(error)
        for field, flag in FLAGS.items():
            if message.startswith(field):
                # In the flag's own words: a flag left out is the API's None.
                message = flag + re.sub(
                    r"\(or None for ([^)]*)\)", rf"(or leave {flag} out for \1)", message[len(field) :]
                )
        raise InputError(message) from None


def check_arguments(args: argparse.Namespace) -> None:
    """The output's own settings: frame rate, encoder quality and preset."""
    if args.fps is not None:
        try:
            check_fps(args.fps, "--fps")
        except ValueError as error:
            raise InputError(str(error)) from None
    low, high = formats.CRF_RANGE
    if not low <= args.crf <= high:
        raise InputError(f"--crf must be a whole number from {low} (lossless) to {high} (worst), got {args.crf}")
    if args.output.suffix.lower() != ".mp4" and (args.crf != DEFAULT_CRF or args.preset != formats.DEFAULT_PRESET):
        raise InputError("--crf and --preset set the mp4 encoder; the output is not an .mp4")
    if args.no_audio and args.audio_model is not None:
        raise InputError("--audio-model names the audio VAE and --no-audio leaves the sound out; give one of them")
    if args.no_audio and args.output.suffix.lower() in formats.AUDIO_FORMATS:
        raise InputError(f"{shown(args.output)}: holds the sound alone, and --no-audio leaves it out; give one of them")
